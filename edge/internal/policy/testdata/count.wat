;; count does as much work as its input is long: codemode_request(n) and
;; codemode_init(n) run their loop n times; a request gets an empty,
;; malformed decision, init succeeds. Each is n + 2 units of fuel: the call,
;; the loop's first entry and n more iterations.
(module
  (memory (export "memory") 1)
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "codemode_init") (param $n i32) (result i64)
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $next)))
    (i64.const 0))
  (func (export "codemode_request") (param $n i32) (result i64)
    (block $done
      (loop $next
        (br_if $done (i32.eqz (local.get $n)))
        (local.set $n (i32.sub (local.get $n) (i32.const 1)))
        (br $next)))
    (i64.const 0)))
