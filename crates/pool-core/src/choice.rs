//! One spelling per choice: each of pool-core's closed choices (prefault
//! method, pin scope, memlock bound, rendezvous) names its values once, in a
//! [`choice!`] table, and gets from it `FromStr`, `Display`, serde (config
//! files and reports), clap's `ValueEnum` (feature `clap`, for the CLI's
//! flags) and [`Choice::ALL`] (for Python's `FromPyObject` and messages).

use std::fmt;

/// A closed choice with one name per value.
pub trait Choice: Copy + Sized + 'static {
    /// What the value is, for messages (`"prefault method"`).
    const WHAT: &'static str;
    /// Every value with its name and a one-line help, in display order.
    const ALL: &'static [(Self, &'static str, &'static str)];

    /// Its name in config files, flags, reports and Python.
    fn name(self) -> &'static str;

    /// The value named `text` (`_` taken as `-`, as Python keyword style
    /// writes it).
    ///
    /// # Errors
    /// [`ChoiceError`] naming the values there are.
    fn parse(text: &str) -> Result<Self, ChoiceError> {
        let wanted = text.trim().replace('_', "-");
        Self::ALL
            .iter()
            .find(|(_, name, _)| *name == wanted)
            .map(|&(value, _, _)| value)
            .ok_or_else(|| ChoiceError {
                what: Self::WHAT,
                given: text.to_string(),
                names: Self::ALL.iter().map(|(_, name, _)| *name).collect(),
            })
    }
}

/// A name that is none of a choice's values.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChoiceError {
    /// What was being chosen (`"prefault method"`).
    pub what: &'static str,
    /// What was given.
    pub given: String,
    /// The names there are.
    pub names: Vec<&'static str>,
}

impl fmt::Display for ChoiceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "`{}` is not a {}: use ", self.given, self.what)?;
        let quoted: Vec<String> = self.names.iter().map(|n| format!("\"{n}\"")).collect();
        match quoted.split_last() {
            Some((last, [])) => write!(f, "{last}"),
            Some((last, rest)) => write!(f, "{} or {last}", rest.join(", ")),
            None => write!(f, "nothing"),
        }
    }
}

impl std::error::Error for ChoiceError {}

/// Implements [`Choice`], `FromStr`, `Display`, serde and (feature `clap`
/// of the crate that calls it) `ValueEnum` for an enum from one table of
/// `Variant => "name", "help"`. Exported, so that a crate of its own (the
/// keeper's `content`) spells its choices the one way.
#[macro_export]
macro_rules! choice {
    ($ty:ident, $what:literal, { $($variant:ident => $name:literal, $help:literal),+ $(,)? }) => {
        impl $crate::Choice for $ty {
            const WHAT: &'static str = $what;
            const ALL: &'static [(Self, &'static str, &'static str)] =
                &[$(($ty::$variant, $name, $help)),+];

            fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }
        }

        impl ::std::str::FromStr for $ty {
            type Err = $crate::ChoiceError;

            fn from_str(text: &str) -> ::std::result::Result<Self, Self::Err> {
                <$ty as $crate::Choice>::parse(text)
            }
        }

        impl ::std::fmt::Display for $ty {
            fn fmt(&self, f: &mut ::std::fmt::Formatter<'_>) -> ::std::fmt::Result {
                f.write_str($crate::Choice::name(*self))
            }
        }

        impl ::serde::Serialize for $ty {
            fn serialize<S: ::serde::Serializer>(&self, s: S) -> ::std::result::Result<S::Ok, S::Error> {
                s.serialize_str($crate::Choice::name(*self))
            }
        }

        impl<'de> ::serde::Deserialize<'de> for $ty {
            fn deserialize<D: ::serde::Deserializer<'de>>(d: D) -> ::std::result::Result<Self, D::Error> {
                let text = <::std::borrow::Cow<'de, str> as ::serde::Deserialize>::deserialize(d)?;
                <$ty as $crate::Choice>::parse(&text).map_err(::serde::de::Error::custom)
            }
        }

        #[cfg(feature = "clap")]
        impl ::clap::ValueEnum for $ty {
            fn value_variants<'a>() -> &'a [Self] {
                &[$($ty::$variant),+]
            }

            fn to_possible_value(&self) -> Option<::clap::builder::PossibleValue> {
                let &(_, name, help) = <$ty as $crate::Choice>::ALL
                    .iter()
                    .find(|(v, _, _)| v == self)?;
                Some(::clap::builder::PossibleValue::new(name).help(help))
            }
        }
    };
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{PinScope, PrefaultChoice, Rendezvous, host::memlock::MemlockPolicy};

    fn round_trips<T>()
    where
        T: Choice + PartialEq + std::fmt::Debug + serde::Serialize + serde::de::DeserializeOwned,
    {
        for &(value, name, help) in T::ALL {
            assert!(!help.is_empty());
            assert_eq!(value.name(), name);
            assert_eq!(T::parse(name).unwrap(), value);
            assert_eq!(serde_json::to_value(value).unwrap(), name);
            assert_eq!(serde_json::from_value::<T>(name.into()).unwrap(), value);
        }
        let e = T::parse("bogus").unwrap_err();
        assert!(e.to_string().contains(T::WHAT), "{e}");
        for &(_, name, _) in T::ALL {
            assert!(e.to_string().contains(&format!("\"{name}\"")), "{e}");
        }
    }

    #[test]
    fn every_choice_reads_back_what_it_writes_and_names_its_values_on_a_typo() {
        round_trips::<PrefaultChoice>();
        round_trips::<PinScope>();
        round_trips::<MemlockPolicy>();
        round_trips::<Rendezvous>();
        assert_eq!(
            PrefaultChoice::parse("populate_write").unwrap(),
            PrefaultChoice::PopulateWrite
        );
        assert_eq!(
            PrefaultChoice::parse("fast").unwrap_err().to_string(),
            "`fast` is not a prefault method: use \"auto\", \"populate-write\", \"touch\" or \"none\""
        );
        let e = serde_json::from_value::<PinScope>("all".into()).unwrap_err();
        assert!(e.to_string().contains("is not a pin scope"), "{e}");
    }
}
