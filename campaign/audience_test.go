package campaign

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// TestFileReaderResumes reads a file in batches, reopening it at each
// position returned, as a resumed fan-out does, and checks that the entries
// are those of one pass.
func TestFileReaderResumes(t *testing.T) {
	content := "a@x\r\n\n" + strings.Repeat("L", lineBuffer+10) + "\n b@x \n" + strings.Repeat("m", 257) + "\nc@x"
	path := filepath.Join(t.TempDir(), "audience.txt")
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	want := []entry{
		{recipient: "a@x", line: 1},
		{line: 2, bad: "blank"},
		{line: 3, bad: "longer than 256 bytes"},
		{recipient: "b@x", line: 4},
		{recipient: strings.Repeat("m", 257), line: 5, bad: "longer than 256 bytes"},
		{recipient: "c@x", line: 6},
	}
	var got []entry
	pos, line, end := "", int64(0), false
	for !end {
		r, err := openFile(path, pos, line)
		if err != nil {
			t.Fatal(err)
		}
		var batch []entry
		batch, pos, end, err = r.next(context.Background(), 2)
		r.Close()
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, batch...)
		line = batch[len(batch)-1].line
	}
	if !slices.Equal(got, want) {
		t.Errorf("entries:\n got %+v\nwant %+v", got, want)
	}
	if want := strconv.Itoa(len(content)); pos != want {
		t.Errorf("end position %s, want the file's size, %s", pos, want)
	}
}
