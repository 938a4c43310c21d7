;; outofbounds answers with an address past the end of its memory.
(module
  (memory (export "memory") 1)
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "codemode_request") (param i32) (result i64)
    (i64.or (i64.shl (i64.const 0x7fff0000) (i64.const 32)) (i64.const 100))))
