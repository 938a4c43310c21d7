;; A request policy that imports a function the host does not offer.
(module
  (import "env" "host_log" (func $log (param i32 i32)))
  (memory (export "memory") 1)
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "codemode_request") (param $n i32) (result i64)
    (call $log (i32.const 1024) (local.get $n))
    (i64.const 0)))
