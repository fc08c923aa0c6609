//! GGUF metadata values, stored compactly: a number array keeps the file's little-endian
//! bytes and a string array one text buffer with the end of each string, so metadata never
//! takes much more memory than the file bytes that describe it (an array of a million `u8`
//! is a million bytes, not a million enum values).

use std::fmt;

/// A metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum GgufValue {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A UTF-8 string.
    Str(String),
    /// An array of scalars or strings (GGUF arrays of arrays are refused, as llama.cpp does).
    Array(GgufArray),
}

impl GgufValue {
    /// The value as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(&self) -> Option<u64> {
        self.item().and_then(|i| i.as_u64())
    }

    /// The value as a float, if it is a number.
    pub fn as_f64(&self) -> Option<f64> {
        self.item().and_then(|i| i.as_f64())
    }

    /// The value as a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            GgufValue::Str(s) => Some(s),
            _ => None,
        }
    }

    /// The value as an array.
    pub fn as_array(&self) -> Option<&GgufArray> {
        match self {
            GgufValue::Array(a) => Some(a),
            _ => None,
        }
    }

    fn item(&self) -> Option<GgufItem<'_>> {
        Some(match *self {
            GgufValue::U64(v) => GgufItem::U64(v),
            GgufValue::I64(v) => GgufItem::I64(v),
            GgufValue::F64(v) => GgufItem::F64(v),
            GgufValue::Bool(v) => GgufItem::Bool(v),
            GgufValue::Str(ref s) => GgufItem::Str(s),
            GgufValue::Array(_) => return None,
        })
    }
}

/// One element of a [`GgufArray`], borrowed from it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum GgufItem<'a> {
    /// Any unsigned integer type.
    U64(u64),
    /// Any signed integer type.
    I64(i64),
    /// f32 or f64.
    F64(f64),
    /// A boolean.
    Bool(bool),
    /// A string.
    Str(&'a str),
}

impl<'a> GgufItem<'a> {
    /// The element as an unsigned integer, if it is a non-negative integer.
    pub fn as_u64(self) -> Option<u64> {
        match self {
            GgufItem::U64(v) => Some(v),
            GgufItem::I64(v) => u64::try_from(v).ok(),
            _ => None,
        }
    }

    /// The element as a float, if it is a number.
    pub fn as_f64(self) -> Option<f64> {
        match self {
            GgufItem::F64(v) => Some(v),
            GgufItem::U64(v) => Some(v as f64),
            GgufItem::I64(v) => Some(v as f64),
            _ => None,
        }
    }

    /// The element as a string.
    pub fn as_str(self) -> Option<&'a str> {
        match self {
            GgufItem::Str(s) => Some(s),
            _ => None,
        }
    }
}

/// A GGUF array: elements of one type.
#[derive(Clone, PartialEq)]
pub struct GgufArray(Elements);

#[derive(Clone, PartialEq)]
enum Elements {
    /// Fixed-width scalars of GGUF type `kind`, as little-endian bytes.
    Scalars { kind: u32, bytes: Vec<u8> },
    /// Strings: all their bytes, and where each one ends.
    Strings { text: String, ends: Vec<usize> },
}

/// Bytes of one scalar of GGUF type `kind`, or `None` for strings, arrays and unknown types.
pub(crate) fn scalar_width(kind: u32) -> Option<usize> {
    Some(match kind {
        0 | 1 | 7 => 1,
        2 | 3 => 2,
        4..=6 => 4,
        10..=12 => 8,
        _ => return None,
    })
}

/// The scalar of GGUF type `kind` in `b` (exactly its width).
pub(crate) fn scalar(kind: u32, b: &[u8]) -> Option<GgufItem<'static>> {
    let mut w = [0u8; 8];
    w.get_mut(..b.len())?.copy_from_slice(b);
    let u = u64::from_le_bytes(w);
    Some(match kind {
        0 | 2 | 4 | 10 => GgufItem::U64(u),
        1 => GgufItem::I64(u as u8 as i8 as i64),
        3 => GgufItem::I64(u as u16 as i16 as i64),
        5 => GgufItem::I64(u as u32 as i32 as i64),
        11 => GgufItem::I64(u as i64),
        6 => GgufItem::F64(f32::from_bits(u as u32) as f64),
        12 => GgufItem::F64(f64::from_bits(u)),
        7 => GgufItem::Bool(u != 0),
        _ => return None,
    })
}

impl GgufArray {
    /// An array of fixed-width scalars of GGUF type `kind` from their little-endian bytes
    /// (`None` unless `kind` is a scalar type and `bytes` whole elements).
    pub(crate) fn scalars(kind: u32, bytes: Vec<u8>) -> Option<GgufArray> {
        let width = scalar_width(kind)?;
        bytes
            .len()
            .is_multiple_of(width)
            .then_some(GgufArray(Elements::Scalars { kind, bytes }))
    }

    /// An array of strings from their concatenation and the end of each.
    pub(crate) fn from_strings(text: String, ends: Vec<usize>) -> GgufArray {
        GgufArray(Elements::Strings { text, ends })
    }

    /// An array of strings.
    pub fn strings<S: AsRef<str>>(items: impl IntoIterator<Item = S>) -> GgufArray {
        let mut text = String::new();
        let mut ends = Vec::new();
        for s in items {
            text.push_str(s.as_ref());
            ends.push(text.len());
        }
        GgufArray(Elements::Strings { text, ends })
    }

    /// An array of u64 values.
    pub fn u64s(items: impl IntoIterator<Item = u64>) -> GgufArray {
        let bytes = items.into_iter().flat_map(u64::to_le_bytes).collect();
        GgufArray(Elements::Scalars { kind: 10, bytes })
    }

    /// An array of i64 values.
    pub fn i64s(items: impl IntoIterator<Item = i64>) -> GgufArray {
        let bytes = items.into_iter().flat_map(i64::to_le_bytes).collect();
        GgufArray(Elements::Scalars { kind: 11, bytes })
    }

    /// An array of f32 values (GGUF's type for scores).
    pub fn f32s(items: impl IntoIterator<Item = f32>) -> GgufArray {
        let bytes = items.into_iter().flat_map(f32::to_le_bytes).collect();
        GgufArray(Elements::Scalars { kind: 6, bytes })
    }

    /// The GGUF type of the elements.
    pub(crate) fn kind(&self) -> u32 {
        match &self.0 {
            Elements::Scalars { kind, .. } => *kind,
            Elements::Strings { .. } => 8,
        }
    }

    /// The scalars' little-endian bytes (`None` for strings).
    pub(crate) fn scalar_bytes(&self) -> Option<&[u8]> {
        match &self.0 {
            Elements::Scalars { bytes, .. } => Some(bytes),
            Elements::Strings { .. } => None,
        }
    }

    /// Elements.
    pub fn len(&self) -> usize {
        match &self.0 {
            Elements::Scalars { kind, bytes } => bytes.len() / scalar_width(*kind).unwrap_or(1),
            Elements::Strings { ends, .. } => ends.len(),
        }
    }

    /// Whether it has no element.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i`.
    pub fn get(&self, i: usize) -> Option<GgufItem<'_>> {
        match &self.0 {
            Elements::Scalars { kind, bytes } => {
                let w = scalar_width(*kind)?;
                let at = i.checked_mul(w)?;
                scalar(*kind, bytes.get(at..at.checked_add(w)?)?)
            }
            Elements::Strings { text, ends } => {
                let end = *ends.get(i)?;
                let begin = if i == 0 { 0 } else { ends[i - 1] };
                text.get(begin..end).map(GgufItem::Str)
            }
        }
    }

    /// The elements in order.
    pub fn iter(&self) -> impl Iterator<Item = GgufItem<'_>> + '_ {
        (0..self.len()).filter_map(|i| self.get(i))
    }
}

impl<'a> IntoIterator for &'a GgufArray {
    type Item = GgufItem<'a>;
    type IntoIter = Box<dyn Iterator<Item = GgufItem<'a>> + 'a>;

    fn into_iter(self) -> Self::IntoIter {
        Box::new(self.iter())
    }
}

impl fmt::Debug for GgufArray {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const SHOWN: usize = 8;
        let mut list = f.debug_list();
        list.entries(self.iter().take(SHOWN));
        if self.len() > SHOWN {
            list.entry(&format_args!("… {} elements", self.len()));
        }
        list.finish()
    }
}
