//! RFC 3161 timestamp tokens as a timestamp authority makes them (a
//! TimeStampResp whose SignedData carries a TSTInfo over a signature, signed
//! attributes with the message digest and ESSCertIDv2, and the signer's
//! issuer and serial), for any key and any certificates a test wants in the
//! token — a forger's included — and the DER they are built of. It checks
//! nothing.

use sha2::Digest as _;

use crate::signing::Signer;

fn hex_sha(d: &[u8]) -> Vec<u8> {
    sha2::Sha256::digest(d).to_vec()
}

/// DER: `tag`, definite length, `content`.
pub fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let n = content.len();
    let mut out = vec![tag];
    if n < 0x80 {
        out.push(n as u8);
    } else {
        let b: Vec<u8> = n
            .to_be_bytes()
            .into_iter()
            .skip_while(|x| *x == 0)
            .collect();
        out.push(0x80 | b.len() as u8);
        out.extend(b);
    }
    out.extend_from_slice(content);
    out
}

/// A DER SEQUENCE of `parts`.
pub fn seq(parts: &[Vec<u8>]) -> Vec<u8> {
    der(0x30, &parts.concat())
}

/// A DER OBJECT IDENTIFIER from its dotted form.
pub fn der_oid(dotted: &str) -> Vec<u8> {
    let arcs: Vec<u64> = dotted.split('.').map(|a| a.parse().unwrap()).collect();
    let mut body = vec![(arcs[0] * 40 + arcs[1]) as u8];
    for &a in &arcs[2..] {
        let mut chunk = vec![(a & 0x7f) as u8];
        let mut v = a >> 7;
        while v > 0 {
            chunk.push(0x80 | (v & 0x7f) as u8);
            v >>= 7;
        }
        chunk.reverse();
        body.extend(chunk);
    }
    der(0x06, &body)
}

/// An RFC 3161 TimeStampResp over `signature` at `at` (Unix seconds),
/// signed by `key`, carrying the certificates `embed` (none, or any a
/// forger likes: the token's certificate set is not signed), whose signed
/// signing-certificate attribute (ESSCertIDv2) names `ess_cert`, or is
/// left out given `None`.
pub fn rfc3161(
    signature: &[u8],
    at: i64,
    key: &Signer,
    embed: &[&[u8]],
    ess_cert: Option<&[u8]>,
) -> Vec<u8> {
    let t = time::OffsetDateTime::from_unix_timestamp(at).unwrap();
    let gen_time = format!(
        "{:04}{:02}{:02}{:02}{:02}{:02}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second()
    );
    let sha256_alg = seq(&[der_oid("2.16.840.1.101.3.4.2.1")]);
    let tst_info = seq(&[
        der(0x02, &[1]),
        der_oid("1.2.3.4.1"),
        seq(&[sha256_alg.clone(), der(0x04, &hex_sha(signature))]),
        der(0x02, &[0x2a]),
        der(0x18, gen_time.as_bytes()),
    ]);
    let attrs = [
        seq(&[
            der_oid("1.2.840.113549.1.9.3"),
            der(0x31, &der_oid("1.2.840.113549.1.9.16.1.4")),
        ]),
        seq(&[
            der_oid("1.2.840.113549.1.9.4"),
            der(0x31, &der(0x04, &hex_sha(&tst_info))),
        ]),
        // id-aa-signingCertificateV2 { certs { ESSCertIDv2 { certHash } } }
        ess_cert
            .map(|c| {
                seq(&[
                    der_oid("1.2.840.113549.1.9.16.2.47"),
                    der(0x31, &seq(&[seq(&[seq(&[der(0x04, &hex_sha(c))])])])),
                ])
            })
            .unwrap_or_default(),
    ]
    .concat();
    let sig = key.sign(&der(0x31, &attrs));
    // The signer's identifier: the named certificate's issuer and serial,
    // as TSAs write it (a verifier may look the certificate up by it).
    let sid = ess_cert
        .and_then(issuer_and_serial)
        .unwrap_or_else(|| der(0x80, &[1, 2, 3, 4]));
    let signer_info = seq(&[
        der(0x02, &[1]),
        sid,
        sha256_alg.clone(),
        der(0xa0, &attrs),
        seq(&[der_oid("1.2.840.10045.4.3.2")]),
        der(0x04, &sig),
    ]);
    let mut signed_data = vec![
        der(0x02, &[3]),
        der(0x31, &sha256_alg),
        seq(&[
            der_oid("1.2.840.113549.1.9.16.1.4"),
            der(0xa0, &der(0x04, &tst_info)),
        ]),
    ];
    if !embed.is_empty() {
        signed_data.push(der(0xa0, &embed.concat()));
    }
    signed_data.push(der(0x31, &signer_info));
    let content_info = seq(&[
        der_oid("1.2.840.113549.1.7.2"),
        der(0xa0, &seq(&signed_data)),
    ]);
    seq(&[seq(&[der(0x02, &[0])]), content_info])
}

/// One DER element of `d`: (its whole encoding, the rest).
fn element(d: &[u8]) -> Option<(&[u8], &[u8])> {
    let len0 = *d.get(1)?;
    let (header, len) = if len0 < 0x80 {
        (2, usize::from(len0))
    } else {
        let n = usize::from(len0 & 0x7f);
        let len = d
            .get(2..2 + n)?
            .iter()
            .fold(0usize, |a, b| (a << 8) | usize::from(*b));
        (2 + n, len)
    };
    (d.len() >= header + len).then(|| d.split_at(header + len))
}

/// The content of the first DER element of `d`.
fn content(d: &[u8]) -> Option<&[u8]> {
    let (whole, _) = element(d)?;
    let len0 = *whole.get(1)?;
    let header = if len0 < 0x80 {
        2
    } else {
        2 + usize::from(len0 & 0x7f)
    };
    whole.get(header..)
}

/// A certificate's `IssuerAndSerialNumber` (DER), read from its TBS.
fn issuer_and_serial(cert: &[u8]) -> Option<Vec<u8>> {
    let mut rest = content(content(cert)?)?;
    if rest.first() == Some(&0xa0) {
        rest = element(rest)?.1;
    }
    let (serial, rest) = element(rest)?;
    let (_, rest) = element(rest)?;
    let (issuer, _) = element(rest)?;
    Some(seq(&[issuer.to_vec(), serial.to_vec()]))
}
