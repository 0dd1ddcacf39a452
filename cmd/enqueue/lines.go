package main

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// lineReader reads a stream line by line, holding at most one line of up to
// max bytes: a longer line is read to its end and dropped, so one huge line
// is a rejected line, not an out-of-memory error or a stop (as with
// bufio.Scanner's token limit). Lines end with "\n"; a "\r" before it (CRLF)
// and a UTF-8 byte order mark opening the stream are dropped too.
type lineReader struct {
	r    *bufio.Reader
	max  int
	buf  []byte
	line int   // number of the last line read, from 1
	off  int64 // bytes read, up to the end of that line
}

func newLineReader(r io.Reader, max int) *lineReader {
	return &lineReader{r: bufio.NewReaderSize(r, 64<<10), max: max}
}

// next returns the next line without its line ending, valid until the next
// call, and its length. A line longer than max comes back as nil with its
// length. At the end of the stream next returns io.EOF; a last line without
// "\n" is still a line. Another error is the reader's.
func (lr *lineReader) next() (line []byte, size int, err error) {
	lr.buf = lr.buf[:0]
	long := false
	for {
		chunk, err := lr.r.ReadSlice('\n')
		lr.off += int64(len(chunk))
		size += len(chunk)
		if !long && len(lr.buf)+len(chunk) > lr.max+len("\r\n") {
			long = true
		}
		if long {
			// Keep only the tail, to tell "\r\n" from "\n".
			lr.buf = append(lr.buf[:0], lastBytes(lr.buf, chunk, 2)...)
		} else {
			lr.buf = append(lr.buf, chunk...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && size == 0:
			return nil, 0, io.EOF
		case err != nil && !errors.Is(err, io.EOF):
			return nil, 0, err
		}
		lr.line++
		end := len(lr.buf)
		if bytes.HasSuffix(lr.buf, []byte("\n")) {
			end--
			if bytes.HasSuffix(lr.buf[:end], []byte("\r")) {
				end--
			}
		}
		size -= len(lr.buf) - end
		line := lr.buf[:end]
		if lr.line == 1 && bytes.HasPrefix(line, []byte("\uFEFF")) && !long {
			line, size = line[3:], size-3
		}
		if long || size > lr.max {
			return nil, size, nil
		}
		return line, size, nil
	}
}

// lastBytes returns the last n bytes of a followed by b.
func lastBytes(a, b []byte, n int) []byte {
	if len(b) >= n {
		return b[len(b)-n:]
	}
	var out []byte
	out = append(out, a[max(0, len(a)-(n-len(b))):]...)
	return append(out, b...)
}
