;; tenantblock is a request-phase policy written in WebAssembly text, to show
;; that ABI v1 needs no SDK: it denies every request from the tenant named in
;; its configuration (the configuration bytes are the tenant name, at most
;; 256 bytes) and allows all others.
;;
;; Build: wat2wasm tenantblock.wat -o tenantblock.wasm
;;
;; Memory layout (one page, grown on demand for large inputs):
;;   0     allow decision:  verdict=ALLOW                      (08 01)
;;   16    deny decision:   verdict=DENY, reason=...           (08 02 12 len ...)
;;   512   "config too long" (init error message)
;;   1024  configured tenant name (at most 256 bytes)
;;   4096  input buffer
(module
  (memory (export "memory") 1)

  (data (i32.const 0) "\08\01")
  (data (i32.const 16) "\08\02\12\28tenant is suspended by the tenant policy")
  (data (i32.const 512) "config too long")

  (global $cfglen (mut i32) (i32.const 0))
  (global $pos (mut i32) (i32.const 0))

  (func (export "codemode_abi_version") (result i32) (i32.const 1))

  ;; codemode_buffer returns the input buffer's address, growing memory so
  ;; that it holds size bytes.
  (func (export "codemode_buffer") (param $size i32) (result i32)
    (local $need i32)
    (local.set $need
      (i32.shr_u (i32.add (i32.add (local.get $size) (i32.const 4096)) (i32.const 65535)) (i32.const 16)))
    (if (i32.gt_u (local.get $need) (memory.size))
      (then
        (if (i32.eq (memory.grow (i32.sub (local.get $need) (memory.size))) (i32.const -1))
          (then unreachable))))
    (i32.const 4096))

  ;; codemode_init keeps the configuration: the tenant to block.
  (func (export "codemode_init") (param $size i32) (result i64)
    (if (i32.gt_u (local.get $size) (i32.const 256))
      (then (return (i64.or (i64.shl (i64.const 512) (i64.const 32)) (i64.const 15)))))
    (memory.copy (i32.const 1024) (i32.const 4096) (local.get $size))
    (global.set $cfglen (local.get $size))
    (i64.const 0))

  ;; varint reads a varint at $pos, advancing it; it traps past $end.
  (func $varint (param $end i32) (result i64)
    (local $v i64) (local $shift i64) (local $b i32)
    (loop $more
      (if (i32.ge_u (global.get $pos) (local.get $end)) (then unreachable))
      (local.set $b (i32.load8_u (global.get $pos)))
      (global.set $pos (i32.add (global.get $pos) (i32.const 1)))
      (local.set $v (i64.or (local.get $v)
        (i64.shl (i64.extend_i32_u (i32.and (local.get $b) (i32.const 0x7f))) (local.get $shift))))
      (local.set $shift (i64.add (local.get $shift) (i64.const 7)))
      (br_if $more (i32.and (local.get $b) (i32.const 0x80))))
    (local.get $v))

  ;; equal compares n bytes at a with the configured tenant.
  (func $equal (param $a i32) (param $n i32) (result i32)
    (local $i i32)
    (if (i32.ne (local.get $n) (global.get $cfglen)) (then (return (i32.const 0))))
    (block $done
      (loop $next
        (br_if $done (i32.ge_u (local.get $i) (local.get $n)))
        (if (i32.ne (i32.load8_u (i32.add (local.get $a) (local.get $i)))
                    (i32.load8_u (i32.add (i32.const 1024) (local.get $i))))
          (then (return (i32.const 0))))
        (local.set $i (i32.add (local.get $i) (i32.const 1)))
        (br $next)))
    (i32.const 1))

  ;; codemode_request walks the top-level fields of RequestInput and denies
  ;; when field 2 (tenant) equals the configured tenant.
  (func (export "codemode_request") (param $size i32) (result i64)
    (local $end i32) (local $tag i32) (local $len i32)
    (local.set $end (i32.add (i32.const 4096) (local.get $size)))
    (global.set $pos (i32.const 4096))
    (block $eof
      (loop $field
        (br_if $eof (i32.ge_u (global.get $pos) (local.get $end)))
        (local.set $tag (i32.wrap_i64 (call $varint (local.get $end))))
        (block $skipped
          (block $bad
            (block $fixed32
              (block $len
                (block $fixed64
                  (block $varint
                    (br_table $varint $fixed64 $len $bad $bad $fixed32 $bad
                      (i32.and (local.get $tag) (i32.const 7))))
                  (drop (call $varint (local.get $end)))
                  (br $skipped))
                (global.set $pos (i32.add (global.get $pos) (i32.const 8)))
                (br $skipped))
              (local.set $len (i32.wrap_i64 (call $varint (local.get $end))))
              (if (i32.gt_u (local.get $len) (i32.sub (local.get $end) (global.get $pos)))
                (then unreachable))
              (if (i32.and
                    (i32.eq (i32.shr_u (local.get $tag) (i32.const 3)) (i32.const 2))
                    (call $equal (global.get $pos) (local.get $len)))
                (then (return (i64.or (i64.shl (i64.const 16) (i64.const 32)) (i64.const 44)))))
              (global.set $pos (i32.add (global.get $pos) (local.get $len)))
              (br $skipped))
            (global.set $pos (i32.add (global.get $pos) (i32.const 4)))
            (br $skipped))
          unreachable)
        (br_if $field (i32.le_u (global.get $pos) (local.get $end)))
        unreachable))
    ;; allow
    (i64.const 2)))
