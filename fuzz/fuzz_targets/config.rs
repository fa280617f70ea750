//! The config file parser and validator: any text gives a config or a one-line error, and a
//! config that parses is written back (`Config::to_toml`) as text that parses to the same
//! config.
#![no_main]

use libfuzzer_sys::fuzz_target;
use qswitch_api::Config;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Config::from_toml(text) {
        Ok(c) => {
            if let Err(e) = c.validate(&[0, 1]) {
                assert!(!e.to_string().contains('\n'));
            }
            let dumped = c.to_toml().expect("a parsed config serializes");
            let again = Config::from_toml(&dumped).expect("a dumped config parses");
            assert_eq!(again, c, "{dumped}");
        }
        Err(e) => assert!(!e.to_string().contains('\n')),
    }
});
