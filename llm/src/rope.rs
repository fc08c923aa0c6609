//! Rotary position embedding settings ([`Rope`]) and the frequency table they give.
//!
//! The rope op has one meaning on every backend: pair `i` of a head turns by
//! `position · inv_freq[i]`. Every rope type is a different table, computed here on the host in
//! f64 the way transformers' `modeling_rope_utils.py` computes it, plus (for yarn) a factor on
//! the attention scores. Settings come from a Hugging Face `config.json` (top-level
//! `rope_theta`, transformers 4.x `rope_scaling`, transformers 5.x `rope_parameters`) or from
//! GGUF metadata (`{arch}.rope.*`) and llama.cpp's `rope_freqs.weight` tensor.

use serde_json::{Map, Value};

use webtensor::error::{Error, Result};

/// How the rotary frequencies are scaled (`rope_type` / `rope_parameters`).
#[derive(Clone, Debug, PartialEq, Default, serde::Serialize)]
#[serde(tag = "rope_type", rename_all = "snake_case")]
pub enum RopeScaling {
    /// `default`: `theta^(−2i/d)`.
    #[default]
    None,
    /// `linear`: every frequency divided by `factor` (positions interpolated).
    Linear {
        /// The divisor.
        factor: f64,
    },
    /// `llama3` (Llama 3.1 and later): long wavelengths divided by `factor`, short ones kept,
    /// those in between interpolated smoothly.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are divided by `factor`.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// The context length of pre-training.
        original_max_position_embeddings: f64,
    },
    /// `yarn`: frequencies blended between interpolation (÷ `factor`) and extrapolation by a
    /// linear ramp over the pairs, and the rotated q/k scaled by `attention_factor`.
    Yarn {
        /// The context extension factor.
        factor: f64,
        /// The context length of pre-training.
        original_max_position_embeddings: f64,
        /// Rotations at which the ramp starts (extrapolation), 32 by default.
        beta_fast: f64,
        /// Rotations at which the ramp ends (interpolation), 1 by default.
        beta_slow: f64,
        /// Factor on cos and sin (so on q and k).
        attention_factor: f64,
        /// Whether the ramp's ends are rounded to whole pairs (floor/ceil).
        truncate: bool,
    },
    /// `longrope` (Phi-3.5, Phi-3 128k): each frequency divided by its own factor, from
    /// `short_factor` for a pass whose longest sequence is within
    /// `original_max_position_embeddings`, else from `long_factor` (for every position of that
    /// pass, as transformers does), and the rotated q/k scaled by `attention_factor`.
    LongRope {
        /// One divisor per rotated pair, for passes within the original length.
        short_factor: Vec<f64>,
        /// One divisor per rotated pair, for longer passes.
        long_factor: Vec<f64>,
        /// The context length of pre-training.
        original_max_position_embeddings: f64,
        /// Factor on cos and sin (so on q and k).
        attention_factor: f64,
    },
    /// `dynamic` (NTK-aware): for a pass whose longest sequence `L` exceeds
    /// `max_position_embeddings`, the base becomes
    /// `theta · (factor·L/max − (factor − 1))^(d/(d−2))`.
    Dynamic {
        /// The scaling factor.
        factor: f64,
    },
    /// llama.cpp's `rope_freqs.weight`: each frequency divided by its own factor (how
    /// `convert_hf_to_gguf.py` stores Llama 3.1's scaling).
    Factors {
        /// One divisor per rotated pair.
        factors: Vec<f32>,
    },
}

/// The rotary settings of a model.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct Rope {
    /// The base of the frequencies (`rope_theta`).
    pub theta: f64,
    /// The scaling applied to them.
    pub scaling: RopeScaling,
}

impl Default for Rope {
    fn default() -> Rope {
        Rope {
            theta: 10_000.0,
            scaling: RopeScaling::None,
        }
    }
}

impl Rope {
    /// The frequency table `[head_dim / 2]` for a pass whose longest sequence has `seq_len`
    /// tokens (only `dynamic` depends on it), for a model trained to `max_positions`.
    pub fn inv_freq(&self, head_dim: usize, seq_len: usize, max_positions: usize) -> Vec<f32> {
        let d = head_dim as f64;
        let base_freq = |theta: f64| -> Vec<f64> {
            (0..head_dim / 2)
                .map(|i| theta.powf(-2.0 * i as f64 / d))
                .collect()
        };
        let freqs: Vec<f64> = match &self.scaling {
            RopeScaling::None => base_freq(self.theta),
            RopeScaling::Linear { factor } => {
                base_freq(self.theta).iter().map(|f| f / factor).collect()
            }
            RopeScaling::Factors { factors } => base_freq(self.theta)
                .iter()
                .zip(factors)
                .map(|(f, &k)| f / k as f64)
                .collect(),
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings: old,
                ..
            } => {
                let factors = match seq_len as f64 > *old {
                    true => long_factor,
                    false => short_factor,
                };
                base_freq(self.theta)
                    .iter()
                    .zip(factors)
                    .map(|(f, k)| f / k)
                    .collect()
            }
            RopeScaling::Dynamic { factor } => {
                let (len, max) = (seq_len.max(max_positions) as f64, max_positions as f64);
                let theta = self.theta * (factor * len / max - (factor - 1.0)).powf(d / (d - 2.0));
                base_freq(theta)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let low_wavelen = old / low_freq_factor;
                let high_wavelen = old / high_freq_factor;
                base_freq(self.theta)
                    .into_iter()
                    .map(|f| {
                        let wavelen = 2.0 * std::f64::consts::PI / f;
                        if wavelen < high_wavelen {
                            f
                        } else if wavelen > low_wavelen {
                            f / factor
                        } else {
                            let smooth = (old / wavelen - low_freq_factor)
                                / (high_freq_factor - low_freq_factor);
                            (1.0 - smooth) * f / factor + smooth * f
                        }
                    })
                    .collect()
            }
            RopeScaling::Yarn {
                factor,
                original_max_position_embeddings: old,
                beta_fast,
                beta_slow,
                truncate,
                ..
            } => {
                // The pair index at which a frequency makes `rotations` turns over `old` tokens.
                let dim_of = |rotations: f64| {
                    d * (old / (rotations * 2.0 * std::f64::consts::PI)).ln()
                        / (2.0 * self.theta.ln())
                };
                let (mut low, mut high) = (dim_of(*beta_fast), dim_of(*beta_slow));
                if *truncate {
                    (low, high) = (low.floor(), high.ceil());
                }
                let (low, mut high) = (low.max(0.0), high.min(d - 1.0));
                if low == high {
                    high += 0.001;
                }
                base_freq(self.theta)
                    .into_iter()
                    .enumerate()
                    .map(|(i, f)| {
                        let ramp = ((i as f64 - low) / (high - low)).clamp(0.0, 1.0);
                        // ramp 0: extrapolation (the frequency as is); 1: interpolation.
                        f / factor * ramp + f * (1.0 - ramp)
                    })
                    .collect()
            }
        };
        freqs.into_iter().map(|f| f as f32).collect()
    }

    /// The factor on the rotated queries and keys (yarn's and longrope's attention factor; 1
    /// otherwise).
    pub fn attention_factor(&self) -> f64 {
        match self.scaling {
            RopeScaling::Yarn {
                attention_factor, ..
            }
            | RopeScaling::LongRope {
                attention_factor, ..
            } => attention_factor,
            _ => 1.0,
        }
    }

    /// The longest pass (its longest sequence, in tokens) whose table is the one of a pass of
    /// one token, for a model trained to `max_positions`: `dynamic` recomputes it past
    /// `max_positions`, `longrope` switches to its long factors past the original length;
    /// every other type has one table.
    pub fn fixed_up_to(&self, max_positions: usize) -> usize {
        match self.scaling {
            RopeScaling::Dynamic { .. } => max_positions,
            RopeScaling::LongRope {
                original_max_position_embeddings,
                ..
            } => original_max_position_embeddings as usize,
            _ => usize::MAX,
        }
    }

    /// The number of values each per-pair factor list of the settings has (`longrope`'s
    /// short and long factors), where there are such lists: it must be `head_dim / 2`.
    pub fn pair_factors(&self) -> Option<(usize, usize)> {
        match &self.scaling {
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                ..
            } => Some((short_factor.len(), long_factor.len())),
            _ => None,
        }
    }

    /// The rope settings of a `config.json` object: `rope_scaling` (transformers 4.x) or
    /// `rope_parameters` (5.x), with `rope_theta` inside them or at the top level.
    /// `max_positions` is the config's `max_position_embeddings`; `original` its top-level
    /// `original_max_position_embeddings` (Phi-3), which takes precedence as in transformers.
    pub fn from_json(
        config: &Map<String, Value>,
        max_positions: usize,
        original: Option<f64>,
        source: &str,
    ) -> Result<Rope> {
        let fail = |field: &str, why: String| Error::config_field(source, field, why);
        let nonnull = |key: &str| config.get(key).filter(|v| !v.is_null());
        let (key, params) = match (nonnull("rope_scaling"), nonnull("rope_parameters")) {
            (Some(p), _) => ("rope_scaling", p),
            (None, Some(p)) => ("rope_parameters", p),
            (None, None) => ("rope_parameters", &Value::Null),
        };
        let empty = Map::new();
        let params = match params {
            Value::Object(m) => m,
            Value::Null => &empty,
            other => return Err(fail(key, format!("= {other} is not an object"))),
        };
        refuse_partial_rotary(config, source)?;
        let theta = top_number(config, "rope_theta", source)?.unwrap_or(10_000.0);
        Rope::from_params(key, params, theta, (max_positions, original), source)
    }

    /// Gemma 3's two rope settings, `[full-attention layers, sliding-window layers]`, as
    /// transformers' `Gemma3TextConfig` reads them: per layer type in `rope_parameters`
    /// (transformers 5), or (4.x) `rope_theta` and `rope_scaling` for the full-attention
    /// layers and `rope_local_base_freq` for the sliding ones; bases 1e6 and 1e4 by default.
    /// The full-attention layers run the default or the linear rope, the sliding ones the
    /// default; any other type is an error naming it.
    pub fn gemma3_from_json(
        config: &Map<String, Value>,
        max_positions: usize,
        source: &str,
    ) -> Result<[Rope; 2]> {
        let fail = |field: &str, why: String| Error::config_field(source, field, why);
        let object = |field: &str, v: Option<&Value>| -> Result<Map<String, Value>> {
            match v {
                None | Some(Value::Null) => Ok(Map::new()),
                Some(Value::Object(m)) => Ok(m.clone()),
                Some(other) => Err(fail(field, format!("= {other} is not an object"))),
            }
        };
        refuse_partial_rotary(config, source)?;
        let per_type = object("rope_parameters", config.get("rope_parameters"))?;
        const TYPES: [&str; 2] = ["full_attention", "sliding_attention"];
        if let Some(k) = per_type.keys().find(|k| !TYPES.contains(&k.as_str())) {
            return Err(fail(
                &format!("rope_parameters.{k}"),
                "is not a layer type; Gemma 3's rope_parameters give full_attention and \
                 sliding_attention"
                    .into(),
            ));
        }
        let defaults = [
            top_number(config, "rope_theta", source)?.unwrap_or(1_000_000.0),
            top_number(config, "rope_local_base_freq", source)?.unwrap_or(10_000.0),
        ];
        // transformers moves a 4.x `rope_scaling` into the full-attention layers' settings.
        let scaling = object("rope_scaling", config.get("rope_scaling"))?;
        let mut ropes = Vec::with_capacity(2);
        for (i, layer_type) in TYPES.into_iter().enumerate() {
            let mut key = format!("rope_parameters.{layer_type}");
            let mut params = object(&key, per_type.get(layer_type))?;
            if i == 0 && !scaling.is_empty() {
                params.extend(scaling.clone());
                key = "rope_scaling".into();
            }
            let rope =
                Rope::from_params(&key, &params, defaults[i], (max_positions, None), source)?;
            let allowed = matches!(
                (i, &rope.scaling),
                (_, RopeScaling::None) | (0, RopeScaling::Linear { .. })
            );
            if !allowed {
                return Err(fail(
                    &format!("{key}.rope_type"),
                    format!(
                        "is not supported for Gemma 3's {layer_type} layers (the default rope{})",
                        if i == 0 { " or linear" } else { "" }
                    ),
                ));
            }
            ropes.push(rope);
        }
        let [full, sliding]: [Rope; 2] = ropes
            .try_into()
            .map_err(|_| Error::invalid("rope", "two layer types expected"))?;
        Ok([full, sliding])
    }

    /// The rope of one parameter object (`params`, found under `key`): `theta` where it gives
    /// no `rope_theta`; `(max_positions, original)` as in [`Rope::from_json`].
    fn from_params(
        key: &str,
        params: &Map<String, Value>,
        theta: f64,
        (max_positions, original): (usize, Option<f64>),
        source: &str,
    ) -> Result<Rope> {
        let fail = |field: &str, why: String| Error::config_field(source, field, why);
        let number = |name: &str| -> Result<Option<f64>> {
            match params.get(name) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_f64()
                    .filter(|x| x.is_finite())
                    .map(Some)
                    .ok_or_else(|| {
                        fail(&format!("{key}.{name}"), format!("= {v} is not a number"))
                    }),
            }
        };
        let required = |name: &str| -> Result<f64> {
            number(name)?.ok_or_else(|| fail(&format!("{key}.{name}"), "is missing".into()))
        };
        let theta = number("rope_theta")?.unwrap_or(theta);
        if !(theta.is_finite() && theta > 1.0) {
            return Err(fail("rope_theta", format!("= {theta} must be above 1")));
        }
        let rope_type = params
            .get("rope_type")
            .or_else(|| params.get("type"))
            .map(|v| {
                v.as_str().ok_or_else(|| {
                    fail(
                        &format!("{key}.rope_type"),
                        format!("= {v} is not a string"),
                    )
                })
            })
            .transpose()?
            .unwrap_or("default");
        if let Some(v) = params
            .get("partial_rotary_factor")
            .filter(|v| v.as_f64() != Some(1.0))
        {
            return Err(fail(
                &format!("{key}.partial_rotary_factor"),
                format!("= {v}: partial rotary embedding is not supported (only 1.0)"),
            ));
        }
        // Transformers moves a top-level `original_max_position_embeddings` (Phi-3) into the
        // parameters of the scaled types, else defaults it to `max_position_embeddings`.
        let original_len = || -> Result<f64> {
            Ok(match original {
                Some(o) => o,
                None => number("original_max_position_embeddings")?.unwrap_or(max_positions as f64),
            })
        };
        let (scaling, allowed): (RopeScaling, &[&str]) = match rope_type {
            "default" => (RopeScaling::None, &[]),
            "linear" => (
                RopeScaling::Linear {
                    factor: required("factor")?,
                },
                &["factor"],
            ),
            "dynamic" => (
                RopeScaling::Dynamic {
                    factor: required("factor")?,
                },
                &["factor"],
            ),
            "llama3" => (
                RopeScaling::Llama3 {
                    factor: required("factor")?,
                    low_freq_factor: required("low_freq_factor")?,
                    high_freq_factor: required("high_freq_factor")?,
                    original_max_position_embeddings: original_len()?,
                },
                &[
                    "factor",
                    "low_freq_factor",
                    "high_freq_factor",
                    "original_max_position_embeddings",
                ],
            ),
            "yarn" => {
                let original = original_len()?;
                let factor = number("factor")?.unwrap_or(max_positions as f64 / original);
                let mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                let attention_factor = match (
                    number("attention_factor")?,
                    number("mscale")?,
                    number("mscale_all_dim")?,
                ) {
                    (Some(a), _, _) => a,
                    (None, Some(m), Some(all)) if m != 0.0 && all != 0.0 => {
                        mscale(factor, m) / mscale(factor, all)
                    }
                    _ => mscale(factor, 1.0),
                };
                let truncate = match params.get("truncate") {
                    None | Some(Value::Null) => true,
                    Some(v) => v.as_bool().ok_or_else(|| {
                        fail(
                            &format!("{key}.truncate"),
                            format!("= {v} is not a boolean"),
                        )
                    })?,
                };
                // `beta_fast or 32` in transformers: a 0 also means the default.
                let beta = |name: &str, default: f64| -> Result<f64> {
                    Ok(number(name)?.filter(|&b| b != 0.0).unwrap_or(default))
                };
                (
                    RopeScaling::Yarn {
                        factor,
                        original_max_position_embeddings: original,
                        beta_fast: beta("beta_fast", 32.0)?,
                        beta_slow: beta("beta_slow", 1.0)?,
                        attention_factor,
                        truncate,
                    },
                    &[
                        "factor",
                        "original_max_position_embeddings",
                        "attention_factor",
                        "beta_fast",
                        "beta_slow",
                        "mscale",
                        "mscale_all_dim",
                        "truncate",
                    ],
                )
            }
            "longrope" => {
                let original = original_len()?;
                let factor = number("factor")?.unwrap_or(max_positions as f64 / original);
                let attention_factor = match number("attention_factor")? {
                    Some(a) => a,
                    None if factor <= 1.0 => 1.0,
                    None => (1.0 + factor.ln() / original.ln()).sqrt(),
                };
                let factors = |name: &str| -> Result<Vec<f64>> {
                    let field = format!("{key}.{name}");
                    let list = params
                        .get(name)
                        .ok_or_else(|| fail(&field, "is missing".into()))?;
                    let values: Option<Vec<f64>> = list
                        .as_array()
                        .map(|a| a.iter().map(Value::as_f64).collect())
                        .unwrap_or(None);
                    values
                        .filter(|v| v.iter().all(|f| f.is_finite() && *f > 0.0))
                        .ok_or_else(|| fail(&field, "is not a list of positive numbers".into()))
                };
                (
                    RopeScaling::LongRope {
                        short_factor: factors("short_factor")?,
                        long_factor: factors("long_factor")?,
                        original_max_position_embeddings: original,
                        attention_factor,
                    },
                    &[
                        "factor",
                        "attention_factor",
                        "short_factor",
                        "long_factor",
                        "original_max_position_embeddings",
                    ],
                )
            }
            other => {
                return Err(fail(
                    &format!("{key}.rope_type"),
                    format!(
                        "= {other:?} is not supported; the rope types are default, linear, \
                         dynamic, llama3, yarn and longrope"
                    ),
                ))
            }
        };
        // A parameter this type does not use would be silently ignored: refuse it.
        const ALWAYS: [&str; 4] = ["rope_type", "type", "rope_theta", "partial_rotary_factor"];
        if let Some(extra) = params
            .keys()
            .find(|k| !ALWAYS.contains(&k.as_str()) && !allowed.contains(&k.as_str()))
        {
            return Err(fail(
                &format!("{key}.{extra}"),
                format!(
                    "is not a parameter of rope type {rope_type:?}, which webtensor implements"
                ),
            ));
        }
        let scaling_factor = match &scaling {
            RopeScaling::Linear { factor }
            | RopeScaling::Dynamic { factor }
            | RopeScaling::Llama3 { factor, .. }
            | RopeScaling::Yarn { factor, .. } => Some(*factor),
            _ => None,
        };
        if let Some(f) = scaling_factor {
            if !(f.is_finite() && f > 0.0) {
                return Err(fail(
                    &format!("{key}.factor"),
                    format!("= {f} must be positive"),
                ));
            }
        }
        if let RopeScaling::LongRope {
            original_max_position_embeddings: original,
            attention_factor,
            ..
        } = &scaling
        {
            if !(*original > 1.0 && attention_factor.is_finite() && *attention_factor > 0.0) {
                return Err(fail(
                    &format!("{key}.original_max_position_embeddings"),
                    format!(
                        "= {original} must exceed 1, with a positive attention factor \
                         ({attention_factor})"
                    ),
                ));
            }
        }
        if let RopeScaling::Llama3 {
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
            ..
        } = &scaling
        {
            if !(high_freq_factor > low_freq_factor
                && *low_freq_factor > 0.0
                && *original_max_position_embeddings > 0.0)
            {
                return Err(fail(
                    &format!("{key}.high_freq_factor"),
                    format!(
                        "= {high_freq_factor} must exceed low_freq_factor = {low_freq_factor} > 0"
                    ),
                ));
            }
        }
        Ok(Rope { theta, scaling })
    }
}

/// A top-level number of a `config.json` (`rope_theta`, ...), if given.
fn top_number(config: &Map<String, Value>, key: &str, source: &str) -> Result<Option<f64>> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| Error::config_field(source, key, format!("= {v} is not a number"))),
    }
}

/// Fails, naming it, where the top level of a `config.json` asks for a partial rotary
/// embedding.
fn refuse_partial_rotary(config: &Map<String, Value>, source: &str) -> Result<()> {
    match config
        .get("partial_rotary_factor")
        .filter(|v| !v.is_null() && v.as_f64() != Some(1.0))
    {
        Some(v) => Err(Error::config_field(
            source,
            "partial_rotary_factor",
            format!("= {v}: partial rotary embedding is not supported (only 1.0)"),
        )),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(json: &str) -> Result<Rope> {
        let v: Value = serde_json::from_str(json).unwrap();
        Rope::from_json(v.as_object().unwrap(), 2048, None, "config.json")
    }

    #[test]
    fn reads_the_three_places_rope_theta_lives() {
        assert_eq!(rope(r#"{"rope_theta": 5e5}"#).unwrap().theta, 5e5);
        let v5 = r#"{"rope_parameters": {"rope_theta": 5e5, "rope_type": "default"}}"#;
        assert_eq!(rope(v5).unwrap().theta, 5e5);
        let v4 = r#"{"rope_theta": 5e5, "rope_scaling": {"type": "linear", "factor": 2.0}}"#;
        let r = rope(v4).unwrap();
        assert_eq!(
            (r.theta, r.scaling),
            (5e5, RopeScaling::Linear { factor: 2.0 })
        );
        assert_eq!(rope("{}").unwrap(), Rope::default());
    }

    #[test]
    fn names_what_it_does_not_implement() {
        let err = rope(r#"{"rope_parameters": {"rope_type": "mrope"}}"#).unwrap_err();
        assert!(
            err.to_string().contains("rope_parameters.rope_type"),
            "{err}"
        );
        let err = rope(r#"{"rope_parameters": {"rope_type": "longrope"}}"#).unwrap_err();
        assert!(
            err.to_string().contains("rope_parameters.short_factor"),
            "{err}"
        );
        let err = rope(r#"{"rope_scaling": {"rope_type": "linear", "factor": 2, "mscale": 1}}"#)
            .unwrap_err();
        assert!(err.to_string().contains("rope_scaling.mscale"), "{err}");
        let err = rope(r#"{"rope_scaling": {"rope_type": "llama3", "factor": 8}}"#).unwrap_err();
        assert!(err.to_string().contains("low_freq_factor"), "{err}");
    }

    /// Llama 3.1's published table: θ = 5e5, d = 128, factor 8, 1, 4, 8192 (values from
    /// transformers' `_compute_llama3_parameters`).
    #[test]
    fn llama3_keeps_high_and_divides_low_frequencies() {
        let r = rope(
            r#"{"rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192}}"#,
        )
        .unwrap();
        let f = r.inv_freq(128, 1, 131072);
        let plain = webtensor::ops::rope_inv_freq(5e5, 128);
        assert_eq!(f[0], plain[0]);
        assert!((f[63] - plain[63] / 8.0).abs() <= plain[63] * 1e-6);
        // Pair 32 has a wavelength of 2π·√5e5 ≈ 4443 tokens: between 8192/4 and 8192.
        assert!(f[32] < plain[32] && f[32] > plain[32] / 8.0);
    }
}
