"""The OpenAI Python client (from PyPI) against `webtensor serve --model`, as a user runs it.

Run by native-tests/openai.rs, which starts the server (the built-in tiny model with a chat
template, a context of CTX tokens, MAX_SEQ sequences) and passes, as JSON on the command line,
the base URL and the texts `webtensor generate` writes greedily for the same prompts: every
completion here, batched with others or alone, streamed or whole, must be exactly that text.
"""

import json
import sys
import threading
import time

import openai

case = json.loads(sys.argv[1])
base = case["base_url"]
client = openai.OpenAI(base_url=base, api_key="none", max_retries=0, timeout=120)


def check(cond, what):
    if not cond:
        raise AssertionError(what)


# /v1/models: the one model.
models = client.models.list().data
check([m.id for m in models] == [case["model"]], f"models: {models}")

# One completion, whole; its usage counts the prompt's tokens with BOS.
first = case["completions"][0]
r = client.completions.create(
    model=case["model"], prompt=first["prompt"], max_tokens=first["max_tokens"], temperature=0
)
check(r.choices[0].text == first["text"], f"{r.choices[0].text!r} != {first['text']!r}")
check(r.choices[0].finish_reason == "length", r.choices[0].finish_reason)
check(r.usage.prompt_tokens == first["prompt_tokens"], r.usage)
check(r.usage.completion_tokens == first["max_tokens"], r.usage)


# Many at once, half streamed: one decode batch serves them all, and each is its own text.
def completion(c, stream, results, i):
    try:
        args = dict(model=case["model"], prompt=c["prompt"], max_tokens=c["max_tokens"],
                    temperature=c["temperature"], seed=c["seed"])
        if stream:
            pieces = [ch.choices[0].text for ch in client.completions.create(stream=True, **args)]
            results[i] = "".join(pieces)
        else:
            results[i] = client.completions.create(**args).choices[0].text
    except Exception as e:  # noqa: BLE001 - reported below
        results[i] = e


jobs = [(c, i % 2 == 0) for i, c in enumerate(case["completions"] * 2)]
results = [None] * len(jobs)
threads = [threading.Thread(target=completion, args=(c, s, results, i))
           for i, (c, s) in enumerate(jobs)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for (c, stream), got in zip(jobs, results):
    check(got == c["text"], f"concurrent (stream={stream}) {c['prompt']!r}: {got!r} != {c['text']!r}")

# Chat through the model's template, streamed; the first chunk names the role.
chat = case["chat"]
chunks = list(client.chat.completions.create(
    model=case["model"], messages=[{"role": "user", "content": chat["prompt"]}],
    max_tokens=chat["max_tokens"], temperature=0, stream=True,
    stream_options={"include_usage": True}))
check(chunks[0].choices[0].delta.role == "assistant", chunks[0])
text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
check(text.strip() == chat["text"].strip(), f"chat: {text!r} != {chat['text']!r}")
check(chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 1, chunks[-1])
whole = client.chat.completions.create(
    model=case["model"], messages=[{"role": "user", "content": chat["prompt"]}],
    max_tokens=chat["max_tokens"], temperature=0)
check(whole.choices[0].message.content == text, whole)

# A stop string ends the text before it.
stop_at = first["text"].split()[1]
r = client.completions.create(model=case["model"], prompt=first["prompt"],
                              max_tokens=first["max_tokens"], temperature=0, stop=[stop_at])
check(r.choices[0].text == first["text"][: first["text"].index(stop_at)], r.choices[0].text)
check(r.choices[0].finish_reason == "stop", r.choices[0].finish_reason)

# The context ends a long completion: prompt and completion fill CTX tokens (the last token
# drawn needs no room in the cache).
r = client.completions.create(model=case["model"], prompt=first["prompt"], max_tokens=100000,
                              temperature=0)
check(r.choices[0].finish_reason == "length", r)
check(r.usage.prompt_tokens + r.usage.completion_tokens == case["ctx"] + 1, r.usage)

# Bad requests: OpenAI-style errors with the right status, naming the field.
for bad, param in [(dict(n=2), "n"), (dict(frequency_penalty=1.0), "frequency_penalty"),
                   (dict(temperature=5), "temperature")]:
    try:
        client.completions.create(model=case["model"], prompt="x", **bad)
        raise AssertionError(f"{bad} was taken")
    except openai.BadRequestError as e:
        check(e.status_code == 400 and e.body["param"] == param, (bad, e.body))
try:
    client.completions.create(model=case["model"], prompt="x " * 5000)
    raise AssertionError("a prompt beyond the context was taken")
except openai.BadRequestError as e:
    check("context" in e.body["message"], e.body)
try:
    client.chat.completions.create(model=case["model"], messages=[])
    raise AssertionError("no messages was taken")
except openai.BadRequestError as e:
    check(e.body["param"] == "messages", e.body)
try:
    client.embeddings.create(model=case["model"], input="x")
    raise AssertionError("embeddings answered")
except openai.NotFoundError as e:
    check(e.status_code == 404, e)

# A full pool's places come back before each answer: MAX_SEQ clients sending requests back to
# back never meet a 503 (a place used to be freed only after its answer was written).
def back_to_back(errors):
    try:
        for _ in range(5):
            client.completions.create(model=case["model"], prompt="x", max_tokens=2)
    except Exception as e:  # noqa: BLE001 - reported below
        errors.append(e)


errors = []
clients = [threading.Thread(target=back_to_back, args=(errors,))
           for _ in range(case["max_sequences"])]
for t in clients:
    t.start()
for t in clients:
    t.join()
check(not errors, f"back-to-back requests at a full pool failed: {errors[:3]}")

# A full pool: MAX_SEQ long streams hold every sequence; one more request is a 503 at once,
# and once the streams are dropped (clients gone) their sequences serve again.
streams = [client.completions.create(model=case["model"], prompt=first["prompt"],
                                     max_tokens=100000, temperature=0, stream=True)
           for _ in range(case["max_sequences"])]
for s in streams:
    next(iter(s))  # each is generating
try:
    client.completions.create(model=case["model"], prompt="x", max_tokens=1)
    raise AssertionError("a request beyond the pool was taken")
except openai.APIStatusError as e:
    check(e.status_code == 503 and e.body["type"] == "server_busy", e.body)
for s in streams:
    s.close()
deadline = time.time() + 60
while True:
    try:
        client.completions.create(model=case["model"], prompt="x", max_tokens=1)
        break
    except openai.APIStatusError as e:
        check(e.status_code == 503 and time.time() < deadline, "sequences never came back")
        time.sleep(0.2)
print("openai client: all checks passed")
