//! Numbers in messages: short enough to read (`1e-300`, not three hundred digits).
//!
//! Owns number formatting only; depends on nothing in the crate.

/// `x` as Rust's shortest round-trip decimal when that is short, else in exponent form.
pub fn short(x: f64) -> String {
    let plain = x.to_string();
    if plain.len() <= 12 {
        plain
    } else {
        format!("{x:e}")
    }
}

/// A message's value as written, shortened when it is a long number.
pub fn short_text(value: &str) -> String {
    match value.parse::<f64>() {
        Ok(x) if value.len() > 12 => short(x),
        _ => value.to_string(),
    }
}

/// `x` for a CSV table: the shortest decimal that reads back as the same bits, plain
/// (`0`, `0.001`, `29073.062050436758`) unless that is longer than the exponent form would
/// read comfortably (`-2.1762898844146505e-9`, `1e300`).
pub fn csv_number(x: f64) -> String {
    let plain = x.to_string();
    if plain.len() <= 21 {
        plain
    } else {
        format!("{x:e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_numbers_take_the_exponent_form() {
        assert_eq!(short(1e-300), "1e-300");
        assert_eq!(short(1e20), "1e20");
        assert_eq!(short(0.5), "0.5");
        assert_eq!(short(1e7), "10000000");
        assert_eq!(short(0.1 + 0.2), "3.0000000000000004e-1");
        assert_eq!(short(f64::NAN), "NaN");
        assert_eq!(short_text("1e-300"), "1e-300");
        assert_eq!(
            short_text(&1e-300f64.to_string()),
            "1e-300",
            "a value already formatted in full"
        );
        assert_eq!(short_text("fmm"), "fmm");
    }

    #[test]
    fn csv_numbers_read_back_as_the_same_bits() {
        for x in [
            0.0,
            1e-3,
            29073.062050436758,
            -2.1762898844146505e-9,
            1e300,
            -0.1,
        ] {
            assert_eq!(csv_number(x).parse::<f64>().unwrap().to_bits(), x.to_bits());
        }
        assert_eq!(csv_number(0.0), "0");
        assert_eq!(csv_number(0.001), "0.001");
        assert_eq!(csv_number(1e300), "1e300");
    }
}
