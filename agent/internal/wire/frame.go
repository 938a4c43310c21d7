package wire

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"sync"

	"google.golang.org/protobuf/proto"
)

// MaxFrameSize is the largest message, in bytes, that [WriteFrame] writes and
// [ReadFrame] accepts. It leaves room for a file of [MaxFileSize] plus the
// rest of a request.
const MaxFrameSize = 8 << 20

const headerSize = 4

// ErrFrameTooLarge is returned (wrapped) for a frame whose length is above
// [MaxFrameSize]. After it, the stream is out of step and must be closed.
var ErrFrameTooLarge = errors.New("frame too large")

// Buffers up to this size are kept for reuse; larger ones (file transfers)
// are left to the garbage collector.
const maxPooledBuffer = 64 << 10

var bufPool = sync.Pool{New: func() any { b := make([]byte, 0, 4096); return &b }}

func getBuffer() *[]byte { return bufPool.Get().(*[]byte) }

func putBuffer(b *[]byte) {
	if cap(*b) <= maxPooledBuffer {
		*b = (*b)[:0]
		bufPool.Put(b)
	}
}

// WriteFrame writes m as one frame with a single call to w.Write, so that
// frames written by concurrent callers that serialize their calls to w never
// interleave.
//
// # Errors
//
// It returns an error wrapping [ErrFrameTooLarge] if m serializes to more
// than [MaxFrameSize] bytes (nothing is written then), or the error of
// marshalling or of w.
func WriteFrame(w io.Writer, m proto.Message) error {
	bp := getBuffer()
	defer putBuffer(bp)
	buf := append((*bp)[:0], 0, 0, 0, 0)
	buf, err := proto.MarshalOptions{}.MarshalAppend(buf, m)
	*bp = buf
	if err != nil {
		return fmt.Errorf("marshal frame: %w", err)
	}
	n := len(buf) - headerSize
	if n > MaxFrameSize {
		return fmt.Errorf("write frame of %d bytes: %w", n, ErrFrameTooLarge)
	}
	binary.BigEndian.PutUint32(buf, uint32(n))
	if _, err := w.Write(buf); err != nil {
		return fmt.Errorf("write frame: %w", err)
	}
	return nil
}

// ReadFrame reads one frame from r and unmarshals it into m, which it resets
// first. It reads exactly the frame's bytes, so r needs no buffering for
// correctness, but a [bufio.Reader] saves system calls.
//
// # Errors
//
//   - [io.EOF] (unwrapped) if r ends cleanly before the frame begins;
//   - an error wrapping [io.ErrUnexpectedEOF] if r ends inside a frame;
//   - an error wrapping [ErrFrameTooLarge] if the frame's length is above
//     [MaxFrameSize] (the body is not read; the stream is then unusable);
//   - an error wrapping the unmarshal error if the body is not a valid m.
func ReadFrame(r io.Reader, m proto.Message) error {
	bp := getBuffer()
	defer putBuffer(bp)
	buf := (*bp)[:headerSize]
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			return io.EOF
		}
		return fmt.Errorf("read frame header: %w", err)
	}
	n := binary.BigEndian.Uint32(buf)
	if n > MaxFrameSize {
		return fmt.Errorf("read frame of %d bytes: %w", n, ErrFrameTooLarge)
	}
	if cap(buf) < int(n) {
		buf = make([]byte, n)
	}
	buf = buf[:n]
	*bp = buf
	if _, err := io.ReadFull(r, buf); err != nil {
		if err == io.EOF {
			err = io.ErrUnexpectedEOF
		}
		return fmt.Errorf("read frame body of %d bytes: %w", n, err)
	}
	// Unmarshal copies bytes fields, so buf may be reused afterwards.
	if err := proto.Unmarshal(buf, m); err != nil {
		return fmt.Errorf("unmarshal frame: %w", err)
	}
	return nil
}
