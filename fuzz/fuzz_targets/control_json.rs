//! Control requests as they arrive on the socket: any bytes give a request or an error.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_api::Request;

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = serde_json::from_slice::<Request>(data) {
        if let Request::PortAdd { port } = &req {
            let _ = port.validate();
        }
        let again = serde_json::to_vec(&req).unwrap();
        assert_eq!(serde_json::from_slice::<Request>(&again).unwrap(), req);
    }
});
