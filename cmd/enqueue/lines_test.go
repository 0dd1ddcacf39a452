package main

import (
	"errors"
	"io"
	"strings"
	"testing"
	"testing/iotest"
)

// readLine is one result of lineReader.next.
type readLine struct {
	line string // "<long>" for a line over the limit
	size int
	num  int
}

func readAll(t *testing.T, r io.Reader, max int) ([]readLine, error) {
	t.Helper()
	lr := newLineReader(r, max)
	var got []readLine
	for {
		line, size, err := lr.next()
		if err != nil {
			if errors.Is(err, io.EOF) {
				return got, nil
			}
			return got, err
		}
		l := string(line)
		if size > max {
			l = "<long>"
		}
		got = append(got, readLine{l, size, lr.line})
	}
}

func TestLineReader(t *testing.T) {
	const max = 100
	long := strings.Repeat("x", 200_000) // several bufio buffers
	tests := []struct {
		name string
		in   string
		want []readLine
	}{
		{"empty", "", nil},
		{"LF", "a\nbb\n", []readLine{{"a", 1, 1}, {"bb", 2, 2}}},
		{"CRLF", "a\r\nbb\r\n", []readLine{{"a", 1, 1}, {"bb", 2, 2}}},
		{"no final break", "a\nbb", []readLine{{"a", 1, 1}, {"bb", 2, 2}}},
		{"blank lines", "\n\r\n \n", []readLine{{"", 0, 1}, {"", 0, 2}, {" ", 1, 3}}},
		{"lone CR kept", "a\rb\n", []readLine{{"a\rb", 3, 1}}},
		{"BOM on line 1 only", "\uFEFFa\n\uFEFFb\n", []readLine{{"a", 1, 1}, {"\uFEFFb", 4, 2}}},
		{"at the limit", strings.Repeat("y", max) + "\r\n", []readLine{{strings.Repeat("y", max), max, 1}}},
		{"one over", strings.Repeat("y", max+1) + "\nz\n", []readLine{{"<long>", max + 1, 1}, {"z", 1, 2}}},
		{"two over, CRLF", strings.Repeat("y", max+2) + "\r\nz\n", []readLine{{"<long>", max + 2, 1}, {"z", 1, 2}}},
		{"huge, CRLF", "a\n" + long + "\r\nb\r\n", []readLine{{"a", 1, 1}, {"<long>", len(long), 2}, {"b", 1, 3}}},
		{"huge, no final break", long, []readLine{{"<long>", len(long), 1}}},
	}
	for _, tt := range tests {
		for _, slow := range []bool{false, true} {
			r := io.Reader(strings.NewReader(tt.in))
			if slow {
				r = iotest.OneByteReader(r)
			}
			got, err := readAll(t, r, max)
			if err != nil {
				t.Errorf("%s (one byte at a time: %t): %v", tt.name, slow, err)
			}
			if !equalLines(got, tt.want) {
				t.Errorf("%s (one byte at a time: %t):\n got %.200v\nwant %.200v", tt.name, slow, got, tt.want)
			}
		}
	}
}

func TestLineReaderError(t *testing.T) {
	broken := errors.New("disk on fire")
	r := io.MultiReader(strings.NewReader("a\nb"), iotest.ErrReader(broken))
	got, err := readAll(t, r, 100)
	if !errors.Is(err, broken) || !equalLines(got, []readLine{{"a", 1, 1}}) {
		t.Errorf("got %v, %v; want line a, then %v", got, err, broken)
	}
}

func equalLines(a, b []readLine) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
