package sdk

import "unsafe"

// Unmarshal decodes the protobuf bytes of a codemode.policy.v1.RequestInput
// into in, replacing its contents. Its strings and byte slices alias b,
// which must not be modified afterwards.
func (in *RequestInput) Unmarshal(b []byte) error {
	*in = RequestInput{}
	r := reader{b: b}
	for {
		num, typ, ok := r.next()
		if !ok {
			break
		}
		switch num {
		case 1:
			s := r.sub(typ)
			in.Execution.unmarshal(&s)
			if s.err != nil {
				r.fail()
			}
		case 2:
			in.Tenant = r.str(typ)
		case 3:
			in.Door = r.str(typ)
		case 4:
			in.RequestID = r.str(typ)
		case 5:
			r.mapEntry(typ, &in.Annotations)
		case 6:
			s := r.sub(typ)
			in.Egress.unmarshal(&s)
			if s.err != nil {
				r.fail()
			}
		case 7:
			s := r.sub(typ)
			if in.APICall == nil {
				in.APICall = new(APICall)
			}
			in.APICall.unmarshal(&s)
			if s.err != nil {
				r.fail()
			}
		case 8:
			in.Subject = r.str(typ)
		default:
			r.skip(typ)
		}
	}
	return r.err
}

func (e *Egress) unmarshal(r *reader) {
	for {
		num, typ, ok := r.next()
		if !ok {
			return
		}
		switch num {
		case 1:
			s := r.sub(typ)
			var rule EgressRule
			for {
				n, t, ok := s.next()
				if !ok {
					break
				}
				switch n {
				case 1:
					rule.Host = s.str(t)
				case 2:
					rule.Ports = s.uint32s(t, rule.Ports)
				default:
					s.skip(t)
				}
			}
			if s.err != nil {
				r.fail()
				return
			}
			e.Allow = append(e.Allow, rule)
		case 2:
			s := r.sub(typ)
			for {
				n, t, ok := s.next()
				if !ok {
					break
				}
				switch n {
				case 1:
					e.Limits.Connections = uint32(s.uint(t))
				case 2:
					e.Limits.Bytes = s.uint(t)
				case 3:
					e.Limits.ConnectionTime = s.duration(t)
				default:
					s.skip(t)
				}
			}
			if s.err != nil {
				r.fail()
				return
			}
		default:
			r.skip(typ)
		}
	}
}

func (c *APICall) unmarshal(r *reader) {
	for {
		num, typ, ok := r.next()
		if !ok {
			return
		}
		switch num {
		case 1:
			c.API = r.str(typ)
		case 2:
			c.Tool = r.str(typ)
		case 3:
			c.ArgumentsJSON = r.str(typ)
		case 4:
			c.Method = r.str(typ)
		case 5:
			c.URL = r.str(typ)
		default:
			r.skip(typ)
		}
	}
}

func (e *Execution) unmarshal(r *reader) {
	for {
		num, typ, ok := r.next()
		if !ok {
			return
		}
		switch num {
		case 1:
			e.Language = r.str(typ)
		case 2:
			e.Code = r.str(typ)
		case 3:
			e.SessionID = r.str(typ)
		case 4:
			e.Timeout = r.duration(typ)
		case 5:
			e.Stdin = r.byteSlice(typ)
		case 6:
			s := r.sub(typ)
			var f File
			for {
				n, t, ok := s.next()
				if !ok {
					break
				}
				switch n {
				case 1:
					f.Path = s.str(t)
				case 2:
					f.Content = s.byteSlice(t)
				default:
					s.skip(t)
				}
			}
			if s.err != nil {
				r.fail()
				return
			}
			e.Files = append(e.Files, f)
		case 7:
			s := r.sub(typ)
			for {
				n, t, ok := s.next()
				if !ok {
					break
				}
				switch n {
				case 1:
					e.MemoryBytes = s.uint(t)
				case 2:
					e.OutputBytes = s.uint(t)
				default:
					s.skip(t)
				}
			}
			if s.err != nil {
				r.fail()
				return
			}
		default:
			r.skip(typ)
		}
	}
}

// Unmarshal decodes the protobuf bytes of a codemode.policy.v1.ResultInput
// into in, replacing its contents. Its strings and byte slices alias b,
// which must not be modified afterwards.
func (in *ResultInput) Unmarshal(b []byte) error {
	*in = ResultInput{}
	r := reader{b: b}
	for {
		num, typ, ok := r.next()
		if !ok {
			break
		}
		switch num {
		case 1:
			s := r.sub(typ)
			in.Result.unmarshal(&s)
			if s.err != nil {
				r.fail()
			}
		case 2:
			in.Tenant = r.str(typ)
		case 3:
			in.Door = r.str(typ)
		case 4:
			in.RequestID = r.str(typ)
		case 5:
			in.Language = r.str(typ)
		case 6:
			r.mapEntry(typ, &in.Annotations)
		default:
			r.skip(typ)
		}
	}
	return r.err
}

func (res *Result) unmarshal(r *reader) {
	for {
		num, typ, ok := r.next()
		if !ok {
			return
		}
		switch num {
		case 1:
			res.ExitCode = int32(r.uint(typ))
		case 2:
			res.Stdout = r.str(typ)
		case 3:
			res.Stderr = r.str(typ)
		case 4:
			res.TimedOut = r.uint(typ) != 0
		case 5:
			res.Truncated = r.uint(typ) != 0
		case 6:
			res.OOMKilled = r.uint(typ) != 0
		case 7:
			res.Duration = r.duration(typ)
		case 8:
			res.Agent = r.str(typ)
		case 9:
			res.SessionID = r.str(typ)
		default:
			r.skip(typ)
		}
	}
}

// AppendMarshal appends the protobuf bytes of d, a
// codemode.policy.v1.RequestDecision, to b.
func (d *RequestDecision) AppendMarshal(b []byte) []byte {
	if d.Verdict != 0 {
		b = appendUint(b, 1, uint64(int64(d.Verdict)))
	}
	if d.Reason != "" {
		b = appendString(b, 2, d.Reason)
	}
	if w := &d.Rewrite; w.Code != nil || w.Language != nil || w.SetStdin {
		n := 0
		if w.Code != nil {
			n += stringSize(1, *w.Code)
		}
		if w.Language != nil {
			n += stringSize(2, *w.Language)
		}
		if w.SetStdin {
			n += stringSize(3, unsafe.String(unsafe.SliceData(w.Stdin), len(w.Stdin)))
		}
		b = appendLen(b, 3, n)
		if w.Code != nil {
			b = appendString(b, 1, *w.Code)
		}
		if w.Language != nil {
			b = appendString(b, 2, *w.Language)
		}
		if w.SetStdin {
			b = appendBytes(b, 3, w.Stdin)
		}
	}
	if l := &d.Limits; *l != (Limits{}) {
		n := 0
		if l.Timeout != 0 {
			n += 1 + varintSize(uint64(durationSize(l.Timeout))) + durationSize(l.Timeout)
		}
		if l.MemoryBytes != 0 {
			n += uintSize(2, l.MemoryBytes)
		}
		if l.OutputBytes != 0 {
			n += uintSize(3, l.OutputBytes)
		}
		b = appendLen(b, 4, n)
		if l.Timeout != 0 {
			b = appendDuration(b, 1, l.Timeout)
		}
		if l.MemoryBytes != 0 {
			b = appendUint(b, 2, l.MemoryBytes)
		}
		if l.OutputBytes != 0 {
			b = appendUint(b, 3, l.OutputBytes)
		}
	}
	// Maps are checked here: a call and a map iteration are costly in a Go
	// guest (see RATIONALE.md), and most decisions have no maps.
	if len(d.Route) > 0 {
		b = appendMap(b, 5, d.Route)
	}
	if d.RoutePriority != 0 {
		b = appendUint(b, 6, uint64(int64(d.RoutePriority)))
	}
	if len(d.Annotations) > 0 {
		b = appendMap(b, 7, d.Annotations)
	}
	if d.Egress != nil {
		b = appendLen(b, 8, d.Egress.size())
		b = d.Egress.appendFields(b)
	}
	return b
}

// size is the length of e's encoding as a message.
func (e *Egress) size() int {
	n := 0
	for i := range e.Allow {
		rs := e.Allow[i].size()
		n += 1 + varintSize(uint64(rs)) + rs
	}
	if ls := e.Limits.size(); ls > 0 {
		n += 1 + varintSize(uint64(ls)) + ls
	}
	return n
}

// appendFields appends e's fields, a codemode.execution.v1.Egress.
func (e *Egress) appendFields(b []byte) []byte {
	for i := range e.Allow {
		x := &e.Allow[i]
		b = appendLen(b, 1, x.size())
		if x.Host != "" {
			b = appendString(b, 1, x.Host)
		}
		if len(x.Ports) > 0 {
			b = appendPacked(b, 2, x.Ports)
		}
	}
	if ls := e.Limits.size(); ls > 0 {
		l := &e.Limits
		b = appendLen(b, 2, ls)
		if l.Connections != 0 {
			b = appendUint(b, 1, uint64(l.Connections))
		}
		if l.Bytes != 0 {
			b = appendUint(b, 2, l.Bytes)
		}
		if l.ConnectionTime != 0 {
			b = appendDuration(b, 3, l.ConnectionTime)
		}
	}
	return b
}

func (x *EgressRule) size() int {
	n := 0
	if x.Host != "" {
		n += stringSize(1, x.Host)
	}
	if len(x.Ports) > 0 {
		ps := packedSize(x.Ports)
		n += 1 + varintSize(uint64(ps)) + ps
	}
	return n
}

func (l *EgressLimits) size() int {
	n := 0
	if l.Connections != 0 {
		n += uintSize(1, uint64(l.Connections))
	}
	if l.Bytes != 0 {
		n += uintSize(2, l.Bytes)
	}
	if l.ConnectionTime != 0 {
		ds := durationSize(l.ConnectionTime)
		n += 1 + varintSize(uint64(ds)) + ds
	}
	return n
}

// AppendMarshal appends the protobuf bytes of d, a
// codemode.policy.v1.ResultDecision, to b.
func (d *ResultDecision) AppendMarshal(b []byte) []byte {
	if d.Verdict != 0 {
		b = appendUint(b, 1, uint64(int64(d.Verdict)))
	}
	if d.Reason != "" {
		b = appendString(b, 2, d.Reason)
	}
	for i := range d.Redactions {
		x := &d.Redactions[i]
		n := 0
		if x.Stream != 0 {
			n += uintSize(1, uint64(int64(x.Stream)))
		}
		if x.Start != 0 {
			n += uintSize(2, uint64(x.Start))
		}
		if x.End != 0 {
			n += uintSize(3, uint64(x.End))
		}
		if x.Replacement != "" {
			n += stringSize(4, x.Replacement)
		}
		b = appendLen(b, 3, n)
		if x.Stream != 0 {
			b = appendUint(b, 1, uint64(int64(x.Stream)))
		}
		if x.Start != 0 {
			b = appendUint(b, 2, uint64(x.Start))
		}
		if x.End != 0 {
			b = appendUint(b, 3, uint64(x.End))
		}
		if x.Replacement != "" {
			b = appendString(b, 4, x.Replacement)
		}
	}
	if d.Stdout != nil {
		b = appendString(b, 4, *d.Stdout)
	}
	if d.Stderr != nil {
		b = appendString(b, 5, *d.Stderr)
	}
	if len(d.Annotations) > 0 {
		b = appendMap(b, 6, d.Annotations)
	}
	return b
}
