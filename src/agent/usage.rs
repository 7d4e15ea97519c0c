//! Summing the token usage of a turn (`finish.usage`, PROTOCOL.md 2.6,
//! whose shape is [`Usage`], a wire type): over the turn (its
//! continuations included), never cumulative across turns. `inputTokens`
//! counts input that was neither read from nor written to the cache
//! (Anthropic's convention; Codex's input total is reduced by its cached
//! part).

use serde_json::Value;

pub use crate::wire::Usage;

fn add_opt<T: std::ops::Add<Output = T> + Copy>(a: Option<T>, b: Option<T>) -> Option<T> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x + y),
        (x, None) => x,
        (None, y) => y,
    }
}

fn sub_opt(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(x), Some(y)) => Some(x.saturating_sub(y)),
        (x, _) => x,
    }
}

/// The adapters' arithmetic on [`Usage`]: the wire crate owns the shape
/// (hosted-boot-wire), the runner how turns add up, as a trait because the
/// type is another crate's.
pub trait Totals {
    /// Adds `other`'s counters; its model replaces ours when it has one.
    fn add(&mut self, other: &Usage);
    /// `self - earlier` for running totals (counters only; saturating).
    fn minus(&self, earlier: &Usage) -> Usage;
    /// The `finish.usage` to send: `None` when nothing was reported.
    fn reported(&self) -> Option<Usage>;
}

impl Totals for Usage {
    fn add(&mut self, other: &Usage) {
        if other.model.is_some() {
            self.model = other.model.clone();
        }
        self.input_tokens = add_opt(self.input_tokens, other.input_tokens);
        self.output_tokens = add_opt(self.output_tokens, other.output_tokens);
        self.cache_read_tokens = add_opt(self.cache_read_tokens, other.cache_read_tokens);
        self.cache_write_tokens = add_opt(self.cache_write_tokens, other.cache_write_tokens);
        self.cost_usd = add_opt(self.cost_usd, other.cost_usd);
    }

    fn minus(&self, earlier: &Usage) -> Usage {
        Usage {
            model: self.model.clone(),
            input_tokens: sub_opt(self.input_tokens, earlier.input_tokens),
            output_tokens: sub_opt(self.output_tokens, earlier.output_tokens),
            cache_read_tokens: sub_opt(self.cache_read_tokens, earlier.cache_read_tokens),
            cache_write_tokens: sub_opt(self.cache_write_tokens, earlier.cache_write_tokens),
            cost_usd: self.cost_usd,
        }
    }

    fn reported(&self) -> Option<Usage> {
        (!self.is_empty()).then(|| self.clone())
    }
}

/// A JSON number as `u64` (integers, or floats without a fraction).
pub fn as_u64(v: Option<&Value>) -> Option<u64> {
    let v = v?;
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0)
            .map(|f| f as u64)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn sums_present_counters_and_omits_absent_ones() {
        let mut a = Usage {
            model: Some("m1".into()),
            input_tokens: Some(10),
            cost_usd: Some(0.1),
            ..Usage::default()
        };
        a.add(&Usage {
            input_tokens: Some(5),
            output_tokens: Some(7),
            cost_usd: Some(0.2),
            ..Usage::default()
        });
        assert_eq!(
            serde_json::to_value(a.reported()).unwrap(),
            json!({"model": "m1", "inputTokens": 15, "outputTokens": 7, "costUsd": 0.3})
        );
        assert_eq!(Usage::default().reported(), None);
    }

    #[test]
    fn minus_subtracts_running_totals() {
        let total = Usage {
            input_tokens: Some(100),
            output_tokens: Some(40),
            ..Usage::default()
        };
        let before = Usage {
            input_tokens: Some(60),
            output_tokens: Some(50),
            ..Usage::default()
        };
        let d = total.minus(&before);
        assert_eq!(d.input_tokens, Some(40));
        assert_eq!(d.output_tokens, Some(0));
    }
}
