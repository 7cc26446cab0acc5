//! Kubernetes quantities read exactly, in integer arithmetic: CPU in millicores, memory in bytes,
//! a device's capacity. Shared by the operator (NodeResourcesFit's arithmetic) and the sharing
//! judgement in [`crate::sharing`].

use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

/// A quantity in thousandths of its unit, rounded up (as the API rounds CPU to millicores).
pub fn milli_units(q: &Quantity) -> Option<i64> {
    scaled(&q.0, 3)
}

/// A quantity in whole units, rounded up.
pub fn units(q: &Quantity) -> Option<i64> {
    scaled(&q.0, 0)
}

/// `s` (a Kubernetes quantity: a signed decimal number, then a binary suffix `Ki`..`Ei`, a
/// decimal suffix `n u m k M G T P E`, or an exponent `e3`/`E3`) times 10^`shift`, rounded up.
fn scaled(s: &str, shift: i32) -> Option<i64> {
    let s = s.trim();
    let end = s.find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-')).unwrap_or(s.len());
    let (number, suffix) = s.split_at(end);
    let (negative, number) = match number.strip_prefix('-') {
        Some(n) => (true, n),
        None => (false, number.strip_prefix('+').unwrap_or(number)),
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() && fraction.is_empty() {
        return None;
    }
    // The digits as an integer, and the power of ten they stand at.
    let digits: String = whole.chars().chain(fraction.chars()).collect();
    let mut mantissa: i128 = digits.parse().ok()?;
    let mut exp10: i32 = shift - fraction.len() as i32;
    let (binary, decimal): (u32, i32) = match suffix {
        "" => (0, 0),
        "Ki" => (10, 0),
        "Mi" => (20, 0),
        "Gi" => (30, 0),
        "Ti" => (40, 0),
        "Pi" => (50, 0),
        "Ei" => (60, 0),
        "n" => (0, -9),
        "u" => (0, -6),
        "m" => (0, -3),
        "k" => (0, 3),
        "M" => (0, 6),
        "G" => (0, 9),
        "T" => (0, 12),
        "P" => (0, 15),
        "E" => (0, 18),
        e if e.starts_with(['e', 'E']) => (0, e[1..].parse().ok()?),
        _ => return None,
    };
    mantissa = mantissa.checked_mul(1i128.checked_shl(binary)?)?;
    exp10 += decimal;
    let value = if exp10 >= 0 {
        mantissa.checked_mul(10i128.checked_pow(exp10 as u32)?)?
    } else {
        let d = 10i128.checked_pow(exp10.unsigned_abs())?;
        (mantissa + d - 1) / d
    };
    let value = if negative { -value } else { value };
    i64::try_from(value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity(s.to_string())
    }

    #[test]
    fn quantities_read_exactly() {
        for (s, milli, whole) in [
            ("2", Some(2000), Some(2)),
            ("500m", Some(500), Some(1)),
            ("1.5", Some(1500), Some(2)),
            ("0.1", Some(100), Some(1)),
            ("100u", Some(1), Some(1)),
            ("16Gi", Some(16 * (1i64 << 30) * 1000), Some(16 * (1 << 30))),
            ("1000Ki", Some(1_024_000_000), Some(1_024_000)),
            ("1e3", Some(1_000_000), Some(1000)),
            ("2k", Some(2_000_000), Some(2000)),
            ("1.5Gi", Some(1_610_612_736_000), Some(1_610_612_736)),
            ("+3", Some(3000), Some(3)),
            ("", None, None),
            ("x", None, None),
            ("3Zi", None, None),
        ] {
            assert_eq!(milli_units(&q(s)), milli, "{s} in milli");
            assert_eq!(units(&q(s)), whole, "{s} whole");
        }
    }
}
