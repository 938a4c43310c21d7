// pyarena.so: pymalloc's arenas from glibc's heap.
//
// Loaded with LD_PRELOAD into the preloaded Python parent alone (the
// languages table's ParentEnv), before the interpreter starts: CPython
// keeps its small objects in 1 MiB arenas, each its own mmap by default,
// and under gVisor a child forked from the parent copies its parent's
// pages no further than a mapping extends. Taken from glibc's heap instead
// (with MALLOC_MMAP_THRESHOLD_ above an arena's size, so that glibc does
// not map one on its own), the arenas share a few large mappings, and a
// forked run copies fewer and larger pieces. pymalloc itself is kept, with
// its memory per object. See agent/internal/runner/RATIONALE.md, "The
// parent's memory allocator".
//
// In a program that is not CPython the library does nothing.

#include <stdlib.h>

// CPython's PyObjectArenaAllocator (Include/cpython/objimpl.h), stable
// since Python 3.4.
typedef struct {
	void *ctx;
	void *(*alloc)(void *ctx, size_t size);
	void (*free)(void *ctx, void *ptr, size_t size);
} arena_allocator;

extern void PyObject_SetArenaAllocator(arena_allocator *allocator) __attribute__((weak));

// Page-aligned, as mmap's arenas are: no pool of an arena is split by
// a page boundary, and pymalloc loses none to alignment.
static void *arena_alloc(void *ctx, size_t size) {
	(void)ctx;
	return aligned_alloc(4096, size);
}

static void arena_free(void *ctx, void *ptr, size_t size) {
	(void)ctx;
	(void)size;
	free(ptr);
}

// Runs before the interpreter's first allocation, so that every arena,
// the first ones included, comes from arena_alloc and goes to arena_free.
__attribute__((constructor)) static void install(void) {
	if (PyObject_SetArenaAllocator == NULL) {
		return;
	}
	arena_allocator a = {NULL, arena_alloc, arena_free};
	PyObject_SetArenaAllocator(&a);
}
