package stdio

import (
	"fmt"
	"os"
)

// Pipes are the standard input, output and error of a process: pipes whose
// child ends are passed to the process and whose parent ends the runner uses.
type Pipes struct {
	inR, inW   *os.File // nil: /dev/null
	outR, outW *os.File
	errR, errW *os.File
	stdin      []byte
}

// NewPipes creates the pipes. Standard input is a pipe if stdin is not empty
// or inPipe is set (its contents are then set later).
func NewPipes(stdin []byte, inPipe bool) (*Pipes, error) {
	s := &Pipes{stdin: stdin}
	var err error
	if len(stdin) > 0 || inPipe {
		if s.inR, s.inW, err = os.Pipe(); err != nil {
			return nil, fmt.Errorf("create pipe: %w", err)
		}
	}
	if s.outR, s.outW, err = os.Pipe(); err != nil {
		s.CloseChild()
		s.CloseParent()
		return nil, fmt.Errorf("create pipe: %w", err)
	}
	if s.errR, s.errW, err = os.Pipe(); err != nil {
		s.CloseChild()
		s.CloseParent()
		return nil, fmt.Errorf("create pipe: %w", err)
	}
	return s, nil
}

// Child returns the files that become the process's fds 0, 1 and 2.
func (s *Pipes) Child() []*os.File { return []*os.File{s.inR, s.outW, s.errW} }

// CloseChild closes the child's ends, once the process has them.
func (s *Pipes) CloseChild() { CloseAll(s.inR, s.outW, s.errW) }

// CloseParent closes the runner's ends, for a process that did not start.
func (s *Pipes) CloseParent() { CloseAll(s.inW, s.outR, s.errR) }

// SetStdin sets what Start feeds to standard input, which must be a pipe.
func (s *Pipes) SetStdin(b []byte) { s.stdin = b }

// Start feeds stdin and pumps stdout and stderr into o.
func (s *Pipes) Start(o *Output) {
	if s.inW != nil {
		Feed(s.inW, s.stdin)
	}
	o.Pump(1, s.outR)
	o.Pump(2, s.errR)
}

// CloseAll closes the files that are not nil.
func CloseAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}
