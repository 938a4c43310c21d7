;; A module with the ABI's common exports and neither phase's.
(module
  (memory (export "memory") 1)
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024)))
