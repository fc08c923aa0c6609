"""A GGUF v3 writer that writes exactly what it is told, impossible values included (repeated
keys, shapes whose sizes overflow, offsets past the end): gguf-py refuses those, and the fuzz
seeds (`fuzz_seeds.py`) and the hostile-input check (`hostile_cli.py`) need them."""
import struct

FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


def string(x):
    """A GGUF string: u64 length, then the bytes."""
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def value(t, v):
    """A metadata value of GGUF type t (9: an array, v = (item type, items))."""
    if t == 8:
        return string(v)
    if t == 9:
        item, items = v
        return struct.pack("<IQ", item, len(items)) + b"".join(value(item, x) for x in items)
    return struct.pack(FMT[t], v)


def gguf(meta, tensors, alignment=32):
    """A GGUF v3 file: meta as (key, type, value), tensors as (name, ggml type, dims, bytes)
    with an optional fifth item, the data offset to declare (default: after the previous
    tensor, aligned). An offset of 2^30 or more is declared as given, its bytes left out."""
    out = b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(meta))
    for k, t, v in meta:
        out += string(k) + struct.pack("<I", t) + value(t, v)
    offset, places = 0, []
    for name, kind, dims, data, *at in tensors:
        at = offset if not at or at[0] is None else at[0]
        out += string(name) + struct.pack("<I", len(dims))
        out += b"".join(struct.pack("<Q", d) for d in reversed(dims)) + struct.pack("<IQ", kind, at)
        places.append(at)
        if at < 1 << 30:
            offset = max(offset, (at + len(data) + alignment - 1) // alignment * alignment)
    out += b"\0" * (-len(out) % alignment)
    body = bytearray()
    for (_, _, _, data, *_), at in zip(tensors, places):
        if at < 1 << 30:
            body[len(body):] = b"\0" * max(0, at + len(data) - len(body))
            body[at:at + len(data)] = data
    return out + bytes(body)
