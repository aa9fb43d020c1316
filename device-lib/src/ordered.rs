//! Floats as ordered integers, for the minimum AMOs (`CPNET_AMO_MIN`,
//! `CPNET_AMO_FETCH_MIN`, a cpnet extension to OpenSHMEM 1.5) and for any
//! other use of unsigned integer comparisons on floats.
//!
//! Encoding (the same in `include/cpnet/device.cuh`, `cpnet_f32_ord` /
//! `cpnet_f64_ord`): take the IEEE-754 bit pattern; for `x >= +0` set the
//! sign bit, for `x < 0` flip every bit; `-0.0` is first mapped to `+0.0`.
//! Then for any two non-NaN floats `a < b` exactly when
//! `ord(a) < ord(b)` as unsigned integers, and `a == b` exactly when the
//! encodings are equal. So an unsigned minimum AMO (`CPNET_T_UINT32` /
//! `CPNET_T_UINT64`) on encodings is a float minimum. `+inf` encodes to the
//! largest value a finite float or infinity can take, which makes it the
//! natural "unreached" distance. NaNs are outside the contract (a NaN
//! encodes above `+inf` or below `-inf` depending on its sign).

/// The ordered encoding of `x` (see the module docs).
pub fn f32_ord(x: f32) -> u32 {
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b >> 31 == 0 { b | (1 << 31) } else { !b }
}

/// The float whose ordered encoding is `e` (inverse of [`f32_ord`]; `-0.0`
/// comes back as `+0.0`).
pub fn f32_from_ord(e: u32) -> f32 {
    f32::from_bits(if e >> 31 == 1 { e & !(1 << 31) } else { !e })
}

/// The ordered encoding of `x` (see the module docs).
pub fn f64_ord(x: f64) -> u64 {
    let b = if x == 0.0 { 0 } else { x.to_bits() };
    if b >> 63 == 0 { b | (1 << 63) } else { !b }
}

/// The float whose ordered encoding is `e` (inverse of [`f64_ord`]).
pub fn f64_from_ord(e: u64) -> f64 {
    f64::from_bits(if e >> 63 == 1 { e & !(1 << 63) } else { !e })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsigned_order_of_encodings_is_the_float_order() {
        let v = [f64::NEG_INFINITY, -1e300, -2.5, -1.0, -1e-300, -0.0, 0.0, 1e-300, 0.5, 1.0, 3.0, 1e300, f64::INFINITY];
        for (i, &a) in v.iter().enumerate() {
            assert_eq!(f64_from_ord(f64_ord(a)), if a == 0.0 { 0.0 } else { a });
            assert_eq!(f32_from_ord(f32_ord(a as f32)), if a as f32 == 0.0 { 0.0 } else { a as f32 });
            for &b in &v[i..] {
                assert_eq!(f64_ord(a).cmp(&f64_ord(b)), a.partial_cmp(&b).unwrap(), "{a} vs {b}");
                let (a32, b32) = (a as f32, b as f32);
                assert_eq!(f32_ord(a32).cmp(&f32_ord(b32)), a32.partial_cmp(&b32).unwrap(), "{a32} vs {b32}");
            }
        }
        assert_eq!(f64_ord(-0.0), f64_ord(0.0));
        assert_eq!(f32_ord(0.0), 1 << 31);
    }
}
