//! A param with a serde attribute: the input struct keeps serde's and schemars' derives.

/// Weather in a town.
#[tool]
pub async fn forecast(
    /// The town.
    #[serde(rename = "town")]
    city: String,
) -> String {
    city
}
