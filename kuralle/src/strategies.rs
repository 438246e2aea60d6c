//! Property-test strategies shared by the unit tests of several modules.

use proptest::prelude::*;
use serde_json::{Map, Number, Value};

/// Arbitrary JSON: every number shape (small and huge integers, any finite double, ±0),
/// strings with controls, astral and non-BMP characters, nested up to four levels.
pub(crate) fn json_value() -> impl Strategy<Value = Value> {
    let number = prop_oneof![
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
        prop_oneof![Just(0.0), Just(-0.0), Just(1e21), Just(1e-7), Just(0.000001), Just(5e-324)]
            .prop_map(|f: f64| Value::Number(Number::from_f64(f).unwrap())),
    ];
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        number,
        "(?s).{0,12}".prop_map(Value::String),
        "[\\u{0}-\\u{1f}\"\\\\\\u{7f}\\u{2028}\\u{ff5a}\\u{1f600}a]{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            proptest::collection::vec(("(?s).{0,6}", inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<_, _>>())),
        ]
    })
}
