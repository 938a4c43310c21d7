;; A request policy whose memory starts at 1024 pages (64 MiB), above the
;; default cap of 512.
(module
  (memory (export "memory") 1024)
  (data (i32.const 0) "\08\01")
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "codemode_request") (param i32) (result i64) (i64.const 2)))
