//! Fuzz target: the frame decoder must never panic, and whatever it accepts must re-encode to
//! exactly the bytes it consumed (the decoder validates fully, so accepted frames are canonical).
#![no_main]

use farvm_memproto::frame::{
    decode, encode, encode_error, Body, Opcode, FLAG_IF_ABSENT,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok((frame, used)) = decode(data) {
        assert!(used <= data.len());
        let mut out = Vec::with_capacity(used);
        match frame.body {
            Body::Error { status, message } => {
                let op = match data[5] | 0x80 {
                    0x82 => Opcode::Read,
                    0x83 => Opcode::Write,
                    0x84 => Opcode::Discard,
                    0x85 => Opcode::Stat,
                    _ => Opcode::Hello,
                };
                encode_error(&mut out, op, status, frame.req_id, frame.namespace, message);
                assert_eq!(out.len(), used);
            }
            _ => {
                encode(&mut out, &frame, data[6] & FLAG_IF_ABSENT != 0);
                assert_eq!(&out[..], &data[..used]);
            }
        }
    }
});
