// Package docs reads the project's Markdown pages (README.md and docs/*.md)
// the way GitHub renders them, for the tests that hold the pages to what they
// promise: their links resolve, and the commands they show run.
package docs

import (
	"regexp"
	"strconv"
	"strings"
	"unicode"
)

// Line is one line of a page outside its fenced code blocks, with its
// 1-based number.
type Line struct {
	N    int
	Text string
}

// Block is a fenced code block: its info string ("sh", "json", ...), its
// text without the fences, and the number of the line that opens it.
type Block struct {
	Info string
	Text string
	N    int
}

// Page is a Markdown page split into the lines outside code blocks and the
// code blocks.
type Page struct {
	Lines  []Line
	Blocks []Block
}

// Parse splits markdown into its prose lines and its fenced code blocks
// (``` fences, indented or not, as in a list item).
func Parse(markdown string) Page {
	var p Page
	var open *Block
	var body []string
	for i, text := range strings.Split(markdown, "\n") {
		n := i + 1
		trimmed := strings.TrimSpace(text)
		if open != nil {
			if trimmed == "```" {
				open.Text = strings.Join(body, "\n")
				p.Blocks = append(p.Blocks, *open)
				open, body = nil, nil
				continue
			}
			body = append(body, text)
			continue
		}
		if strings.HasPrefix(trimmed, "```") {
			open = &Block{Info: strings.TrimSpace(strings.TrimPrefix(trimmed, "```")), N: n}
			continue
		}
		p.Lines = append(p.Lines, Line{N: n, Text: text})
	}
	return p
}

// Heading is a heading of a page: its level (1 for #), its text and the
// anchor GitHub gives it.
type Heading struct {
	Level  int
	Text   string
	Anchor string
	N      int
}

var headingLine = regexp.MustCompile(`^(#{1,6})\s+(.*?)\s*#*\s*$`)

// Headings returns the page's ATX headings in order, with GitHub's anchors:
// a repeated anchor gets -1, -2, ... appended.
func (p Page) Headings() []Heading {
	var hs []Heading
	seen := map[string]int{}
	for _, l := range p.Lines {
		m := headingLine.FindStringSubmatch(l.Text)
		if m == nil {
			continue
		}
		a := Anchor(m[2])
		if k := seen[a]; k > 0 {
			seen[a] = k + 1
			a = a + "-" + strconv.Itoa(k)
		} else {
			seen[a] = 1
		}
		hs = append(hs, Heading{Level: len(m[1]), Text: m[2], Anchor: a, N: l.N})
	}
	return hs
}

var inlineLink = regexp.MustCompile(`\[([^\]]*)\]\([^)]*\)`)

// Anchor is the fragment GitHub makes of a heading's text: links reduced to
// their text, lower case, every character but letters, digits, spaces, '-'
// and '_' dropped, and spaces turned into '-'.
func Anchor(heading string) string {
	heading = inlineLink.ReplaceAllString(heading, "$1")
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

// Section returns the lines and code blocks under the heading whose anchor
// is anchor, up to the next heading of the same or a higher level, and the
// numbers of its first and last lines. ok is false when there is no such
// heading.
func (p Page) Section(anchor string) (sec Page, first, last int, ok bool) {
	hs := p.Headings()
	for i, h := range hs {
		if h.Anchor != anchor {
			continue
		}
		end := int(^uint(0) >> 1)
		for _, next := range hs[i+1:] {
			if next.Level <= h.Level {
				end = next.N
				break
			}
		}
		last = h.N
		for _, l := range p.Lines {
			if l.N >= h.N && l.N < end {
				sec.Lines = append(sec.Lines, l)
				if strings.TrimSpace(l.Text) != "" {
					last = max(last, l.N)
				}
			}
		}
		for _, b := range p.Blocks {
			if b.N > h.N && b.N < end {
				sec.Blocks = append(sec.Blocks, b)
				last = max(last, b.N+strings.Count(b.Text, "\n")+2)
			}
		}
		return sec, h.N, last, true
	}
	return Page{}, 0, 0, false
}

// Shell returns the section's shell blocks (info "sh" or "bash"), in order.
func (p Page) Shell() []Block {
	var out []Block
	for _, b := range p.Blocks {
		if b.Info == "sh" || b.Info == "bash" {
			out = append(out, b)
		}
	}
	return out
}

// Link is a Markdown link in a page's prose: its target as written.
type Link struct {
	Target string
	N      int
}

var (
	codeSpan = regexp.MustCompile("`[^`]*`")
	linkRef  = regexp.MustCompile(`\]\(([^)\s]+)(?:\s+"[^"]*")?\)`)
	autoLink = regexp.MustCompile(`<(https?://[^>]+)>`)
)

// Links returns the targets of the page's inline links and autolinks, outside
// code blocks and code spans.
func (p Page) Links() []Link {
	var out []Link
	for _, l := range p.Lines {
		text := codeSpan.ReplaceAllString(l.Text, "")
		for _, m := range linkRef.FindAllStringSubmatch(text, -1) {
			out = append(out, Link{Target: m[1], N: l.N})
		}
		for _, m := range autoLink.FindAllStringSubmatch(text, -1) {
			out = append(out, Link{Target: m[1], N: l.N})
		}
	}
	return out
}

// QuickStartAnchor is the anchor of the README's quick start, whose shell
// blocks a newcomer runs first.
const QuickStartAnchor = "quick-start"

// Steps are a section's commands: its shell blocks, and the playground URL
// it names (its first autolink).
type Steps struct {
	Shell      []Block
	Playground string
}

// QuickStart returns the commands of a section (see Page.Section).
func QuickStart(sec Page) Steps {
	s := Steps{Shell: sec.Shell()}
	for _, l := range sec.Links() {
		if strings.HasPrefix(l.Target, "http://") && strings.Contains(sec.line(l.N), "<"+l.Target+">") {
			s.Playground = l.Target
			break
		}
	}
	return s
}

func (p Page) line(n int) string {
	for _, l := range p.Lines {
		if l.N == n {
			return l.Text
		}
	}
	return ""
}
