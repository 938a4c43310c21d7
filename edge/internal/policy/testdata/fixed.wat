;; fixed answers every call with its configuration bytes: tests configure it
;; with the decision they want the host to receive, valid or not.
(module
  (memory (export "memory") 1)
  (global $len (mut i32) (i32.const 0))
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param $size i32) (result i32)
    (local $need i32)
    (local.set $need
      (i32.shr_u (i32.add (i32.add (local.get $size) (i32.const 32768)) (i32.const 65535)) (i32.const 16)))
    (if (i32.gt_u (local.get $need) (memory.size))
      (then (drop (memory.grow (i32.sub (local.get $need) (memory.size))))))
    (i32.const 32768))
  (func (export "codemode_init") (param $size i32) (result i64)
    (if (i32.gt_u (local.get $size) (i32.const 16384)) (then unreachable))
    (memory.copy (i32.const 1024) (i32.const 32768) (local.get $size))
    (global.set $len (local.get $size))
    (i64.const 0))
  (func (export "codemode_request") (param $size i32) (result i64)
    (i64.or (i64.shl (i64.const 1024) (i64.const 32)) (i64.extend_i32_u (global.get $len))))
  (func (export "codemode_result") (param $size i32) (result i64)
    (i64.or (i64.shl (i64.const 1024) (i64.const 32)) (i64.extend_i32_u (global.get $len)))))
