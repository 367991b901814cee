//! A minimal DER reader for the structures no crate here parses for us
//! (CMS SignedData around an RFC 3161 TSTInfo): tag, length, content, with
//! definite lengths only, as DER requires. It checks bounds and nothing else;
//! the callers check what each field must be.

/// Why bytes are not the DER a caller expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DerError {
    /// Nothing left where a value was expected.
    #[error("DER: unexpected end")]
    End,
    /// A tag of more than one byte (none of the structures read here has one).
    #[error("DER: multi-byte tags are not supported")]
    MultiByteTag,
    /// A tag without a length.
    #[error("DER: no length")]
    NoLength,
    /// An indefinite, zero-octet or over-4-octet length, or one cut short.
    #[error("DER: bad length")]
    BadLength,
    /// A length beyond the bytes there are.
    #[error("DER: content runs past the end")]
    PastEnd,
    /// Another tag than the structure has there.
    #[error("DER: {what}: expected tag {want:#04x}, found {found:#04x}")]
    Tag {
        /// What was being read.
        what: String,
        /// The tag it must have.
        want: u8,
        /// The tag it has.
        found: u8,
    },
}

/// One TLV: its tag byte, its content, and the whole encoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tlv<'a> {
    /// The identifier octet (single-byte tags only).
    pub tag: u8,
    /// The content octets.
    pub content: &'a [u8],
    /// Tag, length and content.
    pub raw: &'a [u8],
}

/// Reads one TLV from the front of `input`; returns it and the rest.
pub fn read(input: &[u8]) -> Result<(Tlv<'_>, &[u8]), DerError> {
    let (&tag, rest) = input.split_first().ok_or(DerError::End)?;
    if tag & 0x1f == 0x1f {
        return Err(DerError::MultiByteTag);
    }
    let (&first, rest) = rest.split_first().ok_or(DerError::NoLength)?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return Err(DerError::BadLength);
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |a, b| (a << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    if rest.len() < len {
        return Err(DerError::PastEnd);
    }
    let header = input.len() - rest.len();
    Ok((
        Tlv {
            tag,
            content: &rest[..len],
            raw: &input[..header + len],
        },
        &rest[len..],
    ))
}

/// Every TLV inside a constructed value.
pub fn children(content: &[u8]) -> Result<Vec<Tlv<'_>>, DerError> {
    let mut out = Vec::new();
    let mut rest = content;
    while !rest.is_empty() {
        let (t, r) = read(rest)?;
        out.push(t);
        rest = r;
    }
    Ok(out)
}

/// Reads one TLV that must have `tag`.
pub fn expect<'a>(input: &'a [u8], tag: u8, what: &str) -> Result<(Tlv<'a>, &'a [u8]), DerError> {
    let (t, rest) = read(input)?;
    if t.tag != tag {
        return Err(DerError::Tag {
            what: what.to_owned(),
            want: tag,
            found: t.tag,
        });
    }
    Ok((t, rest))
}

/// Encodes `content` under `tag` (definite length).
pub fn encode(tag: u8, content: &[u8]) -> Vec<u8> {
    let n = content.len();
    let mut out = vec![tag];
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let bytes: Vec<u8> = n
            .to_be_bytes()
            .into_iter()
            .skip_while(|b| *b == 0)
            .collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// The dotted form of an OBJECT IDENTIFIER's content.
pub fn oid(content: &[u8]) -> String {
    let mut parts: Vec<u64> = Vec::new();
    let mut v: u64 = 0;
    for (i, b) in content.iter().enumerate() {
        v = (v << 7) | u64::from(b & 0x7f);
        if b & 0x80 == 0 {
            if parts.is_empty() && i < content.len() {
                let (a, b) = if v < 40 {
                    (0, v)
                } else if v < 80 {
                    (1, v - 40)
                } else {
                    (2, v - 80)
                };
                parts.push(a);
                parts.push(b);
            } else {
                parts.push(v);
            }
            v = 0;
        }
    }
    parts
        .iter()
        .map(u64::to_string)
        .collect::<Vec<_>>()
        .join(".")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_short_and_long_lengths_and_refuses_truncation() {
        let (t, rest) = read(&[0x04, 0x02, 0xaa, 0xbb, 0x05, 0x00]).unwrap();
        assert_eq!(
            (t.tag, t.content, rest),
            (0x04, &[0xaa, 0xbb][..], &[0x05, 0x00][..])
        );
        let mut long = vec![0x04, 0x81, 0x80];
        long.extend([1u8; 0x80]);
        assert_eq!(read(&long).unwrap().0.content.len(), 0x80);
        assert_eq!(read(&[0x04, 0x05, 0x00]).unwrap_err(), DerError::PastEnd);
        assert_eq!(read(&[0x04]).unwrap_err(), DerError::NoLength);
        assert_eq!(read(&[]).unwrap_err(), DerError::End);
        assert_eq!(read(&[0x1f, 0x01]).unwrap_err(), DerError::MultiByteTag);
        assert_eq!(read(&[0x04, 0x80]).unwrap_err(), DerError::BadLength);
        assert!(matches!(
            expect(&[0x04, 0x00], 0x30, "certificate").unwrap_err(),
            DerError::Tag {
                want: 0x30,
                found: 0x04,
                ..
            }
        ));
        assert_eq!(
            oid(&[0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x07, 0x02]),
            "1.2.840.113549.1.7.2"
        );
    }
}
