;; A request policy without codemode_abi_version.
(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\08\01")
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "codemode_request") (param i32) (result i64) (i64.const 2)))
