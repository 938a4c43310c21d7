package apicatalog

import (
	"encoding/json"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// template is text with placeholders: {name} stands for the argument name.
// Braces have no other use, so a template with a lone brace is refused.
type template []part

// part is literal text, or (name set) a placeholder.
type part struct{ lit, name string }

var placeholderPattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,63}$`)

func parseTemplate(s string) (template, error) {
	var t template
	for s != "" {
		open := strings.IndexAny(s, "{}")
		if open < 0 {
			t = append(t, part{lit: s})
			break
		}
		if s[open] == '}' {
			return nil, fmt.Errorf("a '}' without '{' in %q", s)
		}
		if open > 0 {
			t = append(t, part{lit: s[:open]})
		}
		end := strings.IndexByte(s[open:], '}')
		if end < 0 {
			return nil, fmt.Errorf("a '{' without '}' in %q", s)
		}
		name := s[open+1 : open+end]
		if !placeholderPattern.MatchString(name) {
			return nil, fmt.Errorf("{%s}: a placeholder is {name}, name being letters, digits and '_'", name)
		}
		t = append(t, part{name: name})
		s = s[open+end+1:]
	}
	return t, nil
}

// single returns the name of a template that is one placeholder and
// nothing else.
func (t template) single() (string, bool) {
	if len(t) == 1 && t[0].name != "" {
		return t[0].name, true
	}
	return "", false
}

// fill writes t with args, each argument's text passed through esc (nil:
// as is). ok is false when an argument t names is absent (missing or
// null); with lenient, an absent argument is written as "" instead.
func (t template) fill(args map[string]any, esc func(string) string, lenient bool) (s string, ok bool, err error) {
	var b strings.Builder
	for _, p := range t {
		if p.name == "" {
			b.WriteString(p.lit)
			continue
		}
		v := args[p.name]
		if v == nil {
			if !lenient {
				return "", false, nil
			}
			continue
		}
		s, err := text(p.name, v)
		if err != nil {
			return "", false, err
		}
		if esc != nil {
			s = esc(s)
		}
		b.WriteString(s)
	}
	return b.String(), true, nil
}

// text writes a scalar argument as text.
func text(name string, v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case bool:
		return strconv.FormatBool(v), nil
	case float64:
		return strconv.FormatFloat(v, 'f', -1, 64), nil
	case json.Number:
		return v.String(), nil
	}
	return "", fmt.Errorf("argument %s must be a string, a number or a boolean to be written into the request", name)
}

// walkBody calls f with the template of every string in a body template,
// and reports the first template that does not parse.
func walkBody(v any, f func(template)) error {
	switch v := v.(type) {
	case string:
		t, err := parseTemplate(v)
		if err != nil {
			return err
		}
		f(t)
	case map[string]any:
		for k, e := range v {
			if err := walkBody(e, f); err != nil {
				return fmt.Errorf("%s: %w", k, err)
			}
		}
	case []any:
		for i, e := range v {
			if err := walkBody(e, f); err != nil {
				return fmt.Errorf("[%d]: %w", i, err)
			}
		}
	}
	return nil
}

// fillBody fills a body template (checked by walkBody) with args. ok is
// false when v names an absent argument; members and elements that do are
// left out of their object or array.
func fillBody(v any, args map[string]any) (out any, ok bool, err error) {
	switch v := v.(type) {
	case string:
		t, err := parseTemplate(v)
		if err != nil {
			return nil, false, err
		}
		if name, one := t.single(); one {
			a := args[name]
			return a, a != nil, nil
		}
		s, ok, err := t.fill(args, nil, false)
		return s, ok, err
	case map[string]any:
		m := make(map[string]any, len(v))
		for k, e := range v {
			f, ok, err := fillBody(e, args)
			if err != nil {
				return nil, false, err
			}
			if ok {
				m[k] = f
			}
		}
		return m, true, nil
	case []any:
		l := make([]any, 0, len(v))
		for _, e := range v {
			f, ok, err := fillBody(e, args)
			if err != nil {
				return nil, false, err
			}
			if ok {
				l = append(l, f)
			}
		}
		return l, true, nil
	}
	return v, true, nil
}
