;; A module with a memory and nothing the ABI asks for.
(module
  (memory (export "memory") 1)
  (func (export "evaluate") (param i32) (result i64) (i64.const 0)))
