;; startloop spins forever in its start function, which runs while it is
;; instantiated.
(module
  (memory (export "memory") 1)
  (func $spin (loop $forever (br $forever)))
  (start $spin)
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "codemode_request") (param i32) (result i64) (i64.const 0)))
