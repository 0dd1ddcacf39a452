package campaign

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/notify-throttle/throttler/config"
	"github.com/notify-throttle/throttler/message"
)

// lineBuffer bounds an audience line's memory: a longer one is skipped
// and counted as invalid.
const lineBuffer = 64 << 10

// entry is one line of a file or member of a set.
type entry struct {
	recipient string
	tz        string // the recipient's time zone, "" if the entry names none
	line      int64  // 1-based line of a file; 0 for a set member
	bad       string // why it is not a recipient; "" when it is one
}

// reader streams an audience a batch at a time from a position, so that a
// resumed fan-out starts at its checkpoint.
type reader interface {
	// next returns about n entries and the position after them; end: none
	// are left after these.
	next(ctx context.Context, n int) (batch []entry, pos string, end bool, err error)
	Close() error
}

// openAudience opens a's reader at pos ("" for the start), line being
// the number of file lines before pos.
func openAudience(rdb redis.UniversalClient, a config.Audience, pos string, line int64) (reader, error) {
	if a.RedisSet != "" {
		var cursor uint64
		if pos != "" {
			c, err := strconv.ParseUint(pos, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("campaign: bad SSCAN cursor %q in progress", pos)
			}
			cursor = c
		}
		return &setReader{rdb: rdb, key: a.RedisSet, cursor: cursor}, nil
	}
	return openFile(a.File, pos, line)
}

// check returns why s is not a recipient, or "": the common cases, before
// message.NewTask's check has the last word.
func check(s string) string {
	switch {
	case s == "":
		return "blank"
	case len(s) > message.MaxRecipientLen:
		return fmt.Sprintf("longer than %d bytes", message.MaxRecipientLen)
	}
	return ""
}

// columns splits an audience entry: the recipient, then optionally a tab
// and the recipient's IANA time zone ("alice@example.com\tEurope/Paris").
func columns(s string) (recipient, tz string) {
	r, z, _ := strings.Cut(strings.TrimSpace(s), "\t")
	return strings.TrimSpace(r), strings.TrimSpace(z)
}

// fileReader reads one entry per line (columns). Its position is a byte
// offset.
type fileReader struct {
	f    *os.File
	r    *bufio.Reader
	off  int64 // bytes before the next line
	line int64 // lines before the next line
}

func openFile(path, pos string, line int64) (*fileReader, error) {
	var off int64
	if pos != "" {
		o, err := strconv.ParseInt(pos, 10, 64)
		if err != nil || o < 0 {
			return nil, fmt.Errorf("campaign: bad file offset %q in progress", pos)
		}
		off = o
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("campaign: audience: %w", err)
	}
	if _, err := f.Seek(off, io.SeekStart); err != nil {
		f.Close()
		return nil, fmt.Errorf("campaign: audience: %w", err)
	}
	return &fileReader{f: f, r: bufio.NewReaderSize(f, lineBuffer), off: off, line: line}, nil
}

func (fr *fileReader) next(ctx context.Context, n int) ([]entry, string, bool, error) {
	batch := make([]entry, 0, n)
	for len(batch) < n {
		e, size, err := fr.readLine()
		if size > 0 {
			fr.off += size
			fr.line++
			batch = append(batch, e)
		}
		if errors.Is(err, io.EOF) {
			return batch, strconv.FormatInt(fr.off, 10), true, nil
		}
		if err != nil {
			return nil, "", false, fmt.Errorf("campaign: audience: %w", err)
		}
	}
	return batch, strconv.FormatInt(fr.off, 10), false, ctx.Err()
}

// readLine reads one line and its size in bytes, newline included; a last
// line without a newline comes with io.EOF.
func (fr *fileReader) readLine() (entry, int64, error) {
	b, err := fr.r.ReadSlice('\n')
	size, long := int64(len(b)), false
	for errors.Is(err, bufio.ErrBufferFull) {
		long = true
		b, err = fr.r.ReadSlice('\n')
		size += int64(len(b))
	}
	e := entry{line: fr.line + 1}
	if long {
		e.bad = fmt.Sprintf("longer than %d bytes", message.MaxRecipientLen)
	} else {
		e.recipient, e.tz = columns(string(b))
		e.bad = check(e.recipient)
	}
	return e, size, err
}

func (fr *fileReader) Close() error { return fr.f.Close() }

// setReader reads the members of a Redis set with SSCAN; its position is
// the cursor. A member SSCAN returns twice is "already there".
type setReader struct {
	rdb    redis.UniversalClient
	key    string
	cursor uint64
}

func (sr *setReader) next(ctx context.Context, n int) ([]entry, string, bool, error) {
	for {
		members, cursor, err := sr.rdb.SScan(ctx, sr.key, sr.cursor, "", int64(n)).Result()
		if err != nil {
			return nil, "", false, fmt.Errorf("campaign: audience: SSCAN %s: %w", sr.key, err)
		}
		sr.cursor = cursor
		if len(members) == 0 && cursor != 0 {
			continue
		}
		batch := make([]entry, len(members))
		for i, m := range members {
			r, tz := columns(m)
			batch[i] = entry{recipient: r, tz: tz, bad: check(r)}
		}
		return batch, strconv.FormatUint(cursor, 10), cursor == 0, nil
	}
}

func (sr *setReader) Close() error { return nil }
