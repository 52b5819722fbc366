//! Decimal and hexadecimal digits without `core::fmt` (whose code uses SSE), for the PV log
//! and the serial console.

/// `v` in decimal, written at the end of `buf`; returns the digits.
pub fn dec(mut v: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    &buf[i..]
}

/// `v` as `0x` and lowercase hex digits without leading zeros.
pub fn hex(v: u64, buf: &mut [u8; 18]) -> &[u8] {
    buf[0] = b'0';
    buf[1] = b'x';
    let mut n = 2;
    let mut started = false;
    for shift in (0..16).rev() {
        let d = ((v >> (shift * 4)) & 0xF) as u8;
        if d != 0 || started || shift == 0 {
            started = true;
            buf[n] = if d < 10 { b'0' + d } else { b'a' + d - 10 };
            n += 1;
        }
    }
    &buf[..n]
}
