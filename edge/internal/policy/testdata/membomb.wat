;; membomb grows its memory a page at a time until the host refuses, then
;; denies with reason "capped" (which it can only reach if growth stopped).
(module
  (memory (export "memory") 1)
  (data (i32.const 0) "\08\02\12\06capped")
  (func (export "codemode_abi_version") (result i32) (i32.const 1))
  (func (export "codemode_buffer") (param i32) (result i32) (i32.const 1024))
  (func (export "codemode_request") (param i32) (result i64)
    (block $refused
      (loop $grow
        (br_if $refused (i32.eq (memory.grow (i32.const 1)) (i32.const -1)))
        ;; touch the new page
        (i32.store8 (i32.sub (i32.mul (memory.size) (i32.const 65536)) (i32.const 1)) (i32.const 1))
        (br $grow)))
    (i64.const 10)))
