//! Byte sizes as operators write them: plain bytes or explicit IEC units.
//!
//! `384GiB` is 384 × 2^30 bytes. `384G` and `384GB` are rejected: the first is
//! ambiguous and the second is decimal (384 × 10^9, about 357.6 GiB), and mixing
//! them up is the classic way to size a pool that does not fit the node's
//! reserved huge pages. Serialized as a plain integer number of bytes.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::layout::format_bytes;

/// A number of bytes, parsed from an integer or a string with an IEC unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct ByteSize(pub u64);

/// Why a size string was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    /// Nothing to parse.
    #[error("empty size; write a number of bytes or a size with an IEC unit such as 4GiB")]
    Empty,
    /// No digits, or a malformed number.
    #[error(
        "`{input}` is not a size; write a number of bytes or a size with an IEC unit such as 4GiB"
    )]
    Malformed {
        /// What the operator wrote.
        input: String,
    },
    /// A decimal or single-letter unit whose meaning is ambiguous.
    #[error(
        "`{input}` uses the ambiguous unit `{unit}`: sizes take IEC units, so write `{suggestion}` \
         ({suggestion_bytes} bytes); {unit} would mean decimal {decimal_hint}, which is not the same size"
    )]
    AmbiguousUnit {
        /// What the operator wrote.
        input: String,
        /// The unit as written.
        unit: String,
        /// The IEC spelling to use instead.
        suggestion: String,
        /// The byte count of the IEC spelling, when representable.
        suggestion_bytes: String,
        /// A short note on what the decimal unit would mean.
        decimal_hint: String,
    },
    /// A unit that is neither IEC nor a known decimal one.
    #[error("`{input}` has the unknown unit `{unit}`; use B, KiB, MiB, GiB or TiB")]
    UnknownUnit {
        /// What the operator wrote.
        input: String,
        /// The unit as written.
        unit: String,
    },
    /// A fraction that does not come to a whole number of bytes.
    #[error("`{input}` is not a whole number of bytes; write it in a smaller unit")]
    Fractional {
        /// What the operator wrote.
        input: String,
    },
    /// Larger than 16 EiB.
    #[error("`{input}` does not fit in 64 bits")]
    Overflow {
        /// What the operator wrote.
        input: String,
    },
}

const IEC_UNITS: [(&str, u32); 7] = [
    ("b", 0),
    ("kib", 10),
    ("mib", 20),
    ("gib", 30),
    ("tib", 40),
    ("pib", 50),
    ("eib", 60),
];

/// Decimal or single-letter units we refuse, with the IEC unit meant most often.
const AMBIGUOUS_UNITS: [(&str, &str, u32); 10] = [
    ("k", "KiB", 3),
    ("kb", "KiB", 3),
    ("m", "MiB", 6),
    ("mb", "MiB", 6),
    ("g", "GiB", 9),
    ("gb", "GiB", 9),
    ("t", "TiB", 12),
    ("tb", "TiB", 12),
    ("p", "PiB", 15),
    ("pb", "PiB", 15),
];

impl ByteSize {
    /// The number of bytes.
    pub const fn get(self) -> u64 {
        self.0
    }

    /// `n` gibibytes.
    pub const fn gib(n: u64) -> ByteSize {
        ByteSize(n << 30)
    }

    /// `n` mebibytes.
    pub const fn mib(n: u64) -> ByteSize {
        ByteSize(n << 20)
    }
}

impl FromStr for ByteSize {
    type Err = SizeError;

    fn from_str(input: &str) -> Result<Self, SizeError> {
        parse_size(input).map(ByteSize)
    }
}

fn parse_size(input: &str) -> Result<u64, SizeError> {
    let s = input.trim();
    if s.is_empty() {
        return Err(SizeError::Empty);
    }
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '_'))
        .unwrap_or(s.len());
    let (number, unit) = (s[..split].replace('_', ""), s[split..].trim());
    let malformed = || SizeError::Malformed {
        input: input.to_string(),
    };
    let (whole, frac) = match number.split_once('.') {
        Some((w, f)) => (w, f),
        None => (number.as_str(), ""),
    };
    if whole.is_empty() || !whole.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) || (number.contains('.') && frac.is_empty()) {
        return Err(malformed());
    }
    let lower = unit.to_ascii_lowercase();
    let shift = if unit.is_empty() {
        0
    } else if let Some((_, shift)) = IEC_UNITS.iter().find(|(u, _)| *u == lower) {
        *shift
    } else if let Some((_, iec, exp)) = AMBIGUOUS_UNITS.iter().find(|(u, _, _)| *u == lower) {
        let suggestion = format!("{number}{iec}");
        let suggestion_bytes = parse_size(&suggestion)
            .map(|b| b.to_string())
            .unwrap_or_else(|_| "more than 2^64".to_string());
        return Err(SizeError::AmbiguousUnit {
            input: input.to_string(),
            unit: unit.to_string(),
            suggestion,
            suggestion_bytes,
            decimal_hint: format!("{number} × 10^{exp} bytes"),
        });
    } else {
        return Err(SizeError::UnknownUnit {
            input: input.to_string(),
            unit: unit.to_string(),
        });
    };
    let overflow = || SizeError::Overflow {
        input: input.to_string(),
    };
    let whole: u128 = whole.parse().map_err(|_| overflow())?;
    let frac_digits = u32::try_from(frac.len()).map_err(|_| malformed())?;
    if frac_digits > 30 {
        return Err(malformed());
    }
    let frac_value: u128 = if frac.is_empty() {
        0
    } else {
        frac.parse().map_err(|_| malformed())?
    };
    let scale = 10u128.pow(frac_digits);
    let unit_bytes = 1u128 << shift;
    let scaled = whole
        .checked_mul(scale)
        .and_then(|w| w.checked_add(frac_value))
        .and_then(|n| n.checked_mul(unit_bytes))
        .ok_or_else(overflow)?;
    if scaled % scale != 0 {
        return Err(SizeError::Fractional {
            input: input.to_string(),
        });
    }
    u64::try_from(scaled / scale).map_err(|_| overflow())
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&format_bytes(self.0))
    }
}

impl Serialize for ByteSize {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ByteSize;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number of bytes or a string such as \"4GiB\"")
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<ByteSize, E> {
                Ok(ByteSize(v))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<ByteSize, E> {
                u64::try_from(v)
                    .map(ByteSize)
                    .map_err(|_| E::custom(format!("size {v} is negative")))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<ByteSize, E> {
                // JSON gives a float for `1e10`, and for an integer beyond
                // u64 (Python's json.dumps(10**30)).
                const TWO_POW_64: f64 = 18_446_744_073_709_551_616.0;
                if v.is_finite() && v.fract() == 0.0 && (0.0..TWO_POW_64).contains(&v) {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    return Ok(ByteSize(v as u64));
                }
                if v.is_finite() && v >= TWO_POW_64 {
                    return Err(E::custom(format!(
                        "size {v} bytes is more than 16 EiB, beyond what a 64-bit byte count holds; \
                         a pool is at most 64 PiB"
                    )));
                }
                if v < 0.0 {
                    return Err(E::custom(format!("size {v} is negative")));
                }
                Err(E::custom(format!(
                    "size {v} is not a whole number of bytes; write a string with a unit such as \"1.5GiB\""
                )))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ByteSize, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_floats_are_whole_bytes_or_say_what_is_wrong() {
        let parse = |text: &str| serde_json::from_str::<ByteSize>(text).map_err(|e| e.to_string());
        assert_eq!(parse("1e10"), Ok(ByteSize(10_000_000_000)));
        assert_eq!(parse("4096.0"), Ok(ByteSize(4096)));
        let huge = parse("1000000000000000000000000000000").unwrap_err();
        assert!(
            huge.contains("more than 16 EiB") && huge.contains("64 PiB"),
            "{huge}"
        );
        let frac = parse("1.5").unwrap_err();
        assert!(frac.contains("not a whole number"), "{frac}");
        assert!(parse("-1.0").unwrap_err().contains("negative"));
    }

    #[test]
    fn iec_units_parse_to_exact_bytes() {
        assert_eq!("4GiB".parse(), Ok(ByteSize(4 << 30)));
        assert_eq!("4 GiB".parse(), Ok(ByteSize(4 << 30)));
        assert_eq!("384gib".parse(), Ok(ByteSize(384 << 30)));
        assert_eq!("1.5GiB".parse(), Ok(ByteSize(3 << 29)));
        assert_eq!("2MiB".parse(), Ok(ByteSize(2 << 20)));
        assert_eq!("1TiB".parse(), Ok(ByteSize(1 << 40)));
        assert_eq!("4096".parse(), Ok(ByteSize(4096)));
        assert_eq!("4096B".parse(), Ok(ByteSize(4096)));
        assert_eq!("1_073_741_824".parse(), Ok(ByteSize(1 << 30)));
        assert_eq!("0".parse(), Ok(ByteSize(0)));
    }

    #[test]
    fn decimal_and_single_letter_units_are_rejected_with_the_iec_spelling() {
        for input in ["384G", "384GB", "384gb", "384 G"] {
            let err = input.parse::<ByteSize>().unwrap_err();
            assert!(
                matches!(err, SizeError::AmbiguousUnit { .. }),
                "{input}: {err:?}"
            );
            let msg = err.to_string();
            assert!(
                msg.contains("384GiB"),
                "{input}: message must suggest 384GiB: {msg}"
            );
            assert!(msg.contains(&(384u64 << 30).to_string()), "{msg}");
        }
        let msg = "2M".parse::<ByteSize>().unwrap_err().to_string();
        assert!(msg.contains("2MiB"), "{msg}");
    }

    #[test]
    fn malformed_sizes_are_errors() {
        assert_eq!("".parse::<ByteSize>(), Err(SizeError::Empty));
        assert!(matches!(
            "GiB".parse::<ByteSize>(),
            Err(SizeError::Malformed { .. })
        ));
        assert!(matches!(
            "1.GiB".parse::<ByteSize>(),
            Err(SizeError::Malformed { .. })
        ));
        assert!(matches!(
            "-1GiB".parse::<ByteSize>(),
            Err(SizeError::Malformed { .. })
        ));
        assert!(matches!(
            "4 parsecs".parse::<ByteSize>(),
            Err(SizeError::UnknownUnit { .. })
        ));
        assert!(matches!(
            "1.5".parse::<ByteSize>(),
            Err(SizeError::Fractional { .. })
        ));
        assert!(matches!(
            "16EiB".parse::<ByteSize>(),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            "99999999999999999999999999999999999999999".parse::<ByteSize>(),
            Err(SizeError::Overflow { .. })
        ));
        assert_eq!("15EiB".parse(), Ok(ByteSize(15 << 60)));
    }

    #[test]
    fn serde_reads_integers_and_strings_and_writes_integers() {
        let v: ByteSize = serde_json::from_str("\"4GiB\"").unwrap();
        assert_eq!(v, ByteSize(4 << 30));
        let v: ByteSize = serde_json::from_str("1234567").unwrap();
        assert_eq!(serde_json::to_string(&v).unwrap(), "1234567");
        assert!(serde_json::from_str::<ByteSize>("-1").is_err());
        assert!(serde_json::from_str::<ByteSize>("1.5").is_err());
        let err = serde_json::from_str::<ByteSize>("\"384G\"")
            .unwrap_err()
            .to_string();
        assert!(err.contains("384GiB"), "{err}");
    }
}
