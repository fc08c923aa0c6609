//! The bytes of a host storage of a raw dtype (f16, the block formats, ...): owned, or a
//! range borrowed from a shared buffer such as a memory-mapped model file. A weight loaded
//! from a mapped file is then held once, in the page cache, instead of once there and once
//! more in a copy; where a backend keeps its own layout of a weight (the cpu backend's
//! repacked rows), it [`HostBytes::release`]s the borrowed pages, and the copy replaces them.

use std::fmt;
use std::ops::{Deref, Range};
use std::sync::Arc;

use crate::error::{Error, Result};

/// A buffer that host storages may borrow ranges of.
pub trait SharedBytes: Send + Sync {
    /// The whole buffer.
    fn bytes(&self) -> &[u8];

    /// Lets the operating system drop the resident pages wholly inside `range`: the next read
    /// brings them back from the file, with the same contents. Nothing where the buffer is
    /// plain memory (the default), as its bytes cannot be read back from anywhere.
    fn release(&self, range: Range<usize>) {
        let _ = range;
    }
}

impl SharedBytes for Vec<u8> {
    fn bytes(&self) -> &[u8] {
        self
    }
}

/// Owned bytes, or a range of a [`SharedBytes`] buffer; reads the same either way. Writing
/// ([`HostBytes::to_mut`]) copies borrowed bytes into owned ones first.
#[derive(Clone)]
pub struct HostBytes(Repr);

#[derive(Clone)]
enum Repr {
    Owned(Vec<u8>),
    Borrowed(Arc<dyn SharedBytes>, Range<usize>),
}

impl HostBytes {
    /// `range` of `source`, borrowed; an error where the range is not inside the buffer.
    pub fn borrowed(source: Arc<dyn SharedBytes>, range: Range<usize>) -> Result<HostBytes> {
        let len = source.bytes().len();
        if range.start > range.end || range.end > len {
            return Err(Error::invalid(
                "host bytes",
                format!("the range {range:?} is not inside a buffer of {len} bytes"),
            ));
        }
        Ok(HostBytes(Repr::Borrowed(source, range)))
    }

    /// Whether the bytes are borrowed from a shared buffer.
    pub fn is_borrowed(&self) -> bool {
        matches!(self.0, Repr::Borrowed(..))
    }

    /// The bytes, writable: borrowed ones are copied into owned ones first.
    pub fn to_mut(&mut self) -> &mut Vec<u8> {
        if let Repr::Borrowed(source, range) = &self.0 {
            self.0 = Repr::Owned(source.bytes()[range.clone()].to_vec());
        }
        match &mut self.0 {
            Repr::Owned(v) => v,
            Repr::Borrowed(..) => unreachable!("made owned just above"),
        }
    }

    /// The bytes as an owned vector (a copy where they are borrowed).
    pub fn into_vec(self) -> Vec<u8> {
        match self.0 {
            Repr::Owned(v) => v,
            Repr::Borrowed(source, range) => source.bytes()[range].to_vec(),
        }
    }

    /// Lets the pages of borrowed bytes leave memory until they are read again (see
    /// [`SharedBytes::release`]); nothing for owned bytes. For a holder that keeps the
    /// contents in another form and reads these bytes rarely, if ever.
    pub fn release(&self) {
        if let Repr::Borrowed(source, range) = &self.0 {
            source.release(range.clone());
        }
    }
}

impl Deref for HostBytes {
    type Target = [u8];

    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Owned(v) => v,
            Repr::Borrowed(source, range) => &source.bytes()[range.clone()],
        }
    }
}

impl From<Vec<u8>> for HostBytes {
    fn from(v: Vec<u8>) -> HostBytes {
        HostBytes(Repr::Owned(v))
    }
}

impl PartialEq for HostBytes {
    fn eq(&self, other: &HostBytes) -> bool {
        **self == **other
    }
}

impl fmt::Debug for HostBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&**self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn borrowed_bytes_read_as_their_range_and_copy_on_write() {
        let source: Arc<dyn SharedBytes> = Arc::new((0u8..10).collect::<Vec<u8>>());
        let mut b = HostBytes::borrowed(source.clone(), 2..5).unwrap();
        assert!(b.is_borrowed());
        assert_eq!(&*b, &[2, 3, 4]);
        assert_eq!(b, HostBytes::from(vec![2, 3, 4]));
        b.to_mut()[0] = 9;
        assert!(!b.is_borrowed());
        assert_eq!(&*b, &[9, 3, 4]);
        assert_eq!(
            &source.bytes()[2..5],
            &[2, 3, 4],
            "the shared buffer is unchanged"
        );
        assert!(HostBytes::borrowed(source, 8..11).is_err());
    }
}
