package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/hibiken/asynq"

	"github.com/notify-throttle/throttler/intake"
	"github.com/notify-throttle/throttler/message"
)

// Throughput settings of file mode.
const (
	senders = 8 // enqueues under way at once
	// window is how many lines may be read past the oldest one not done
	// yet; it bounds the memory kept to report in line order.
	window  = 4096
	refresh = 100 * time.Millisecond // how often the progress bar is redrawn and stderr flushed
)

// runFile enqueues one notification per line of -file, reports each
// rejected line and prints a summary.
func runFile(ctx context.Context, o *options, p process) error {
	if o.file == "" {
		return usagef("-file needs a path, or - for stdin")
	}
	c, err := loadChecker(o, p)
	if err != nil {
		return err
	}
	in, err := openInput(o.file, p.stdin)
	if err != nil {
		return err
	}
	defer in.close()
	rdb, closeRedis, err := connect(ctx, c.Config)
	if err != nil {
		return err
	}
	defer closeRedis()
	b := &batch{
		check:  c,
		client: newProducer(rdb, c.Config, p.stderr),
		name:   in.name,
		resume: resumeHint(o),
	}
	out := bufio.NewWriter(p.stderr)
	defer out.Flush()
	var bar *progress
	if p.terminal {
		bar = &progress{w: out, size: in.size, start: time.Now()}
	}
	return b.run(ctx, in.r, out, bar)
}

// input is the stream -file names.
type input struct {
	r     io.Reader
	name  string // as messages name it: the path, or "stdin"
	size  int64  // its size when it is a regular file, for the progress bar; else 0
	close func()
}

func openInput(path string, stdin io.Reader) (input, error) {
	in := input{r: stdin, name: "stdin", close: func() {}}
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return input{}, err
		}
		in = input{r: f, name: path, close: func() { f.Close() }}
	}
	if f, ok := in.r.(*os.File); ok {
		fi, err := f.Stat()
		if path != "-" && (err != nil || fi.IsDir()) {
			in.close()
			return input{}, cmp.Or(err, fmt.Errorf("-file %s: is a directory", path))
		}
		if err == nil && fi.Mode().IsRegular() {
			in.size = fi.Size()
		}
	}
	return in, nil
}

// batch enqueues the lines of one input.
type batch struct {
	check  intake.Checker
	client *producer
	name   string
	resume func(line int) string // a command that resumes from a line, or ""
}

// state is where an item of the input stands.
type state int

const (
	stateReady     state = iota // checked, to be enqueued
	stateRejected               // a bad line, never enqueued
	stateEnqueued               // enqueued
	stateDuplicate              // its task ID was already in the queue
	stateFailed                 // enqueueing it failed: stop
	stateEnd                    // the end of the input; err is a read error
)

// item is one non-blank line of the input, or its end.
type item struct {
	seq   int   // position among items, from 0
	line  int   // line number; for the end, the lines read
	off   int64 // bytes read up to the end of the line
	state state
	job   intake.Job
	err   error // why it was rejected or failed
}

// run reads the input and enqueues its lines: one goroutine reads and checks
// them in order, senders enqueue, and this one reports every outcome in line
// order. A failed enqueue (or ctx ending) stops reading; what is under way
// finishes, so that the report says exactly what was done.
func (b *batch) run(ctx context.Context, in io.Reader, out *bufio.Writer, bar *progress) error {
	stop := make(chan struct{})
	work := make(chan item, 2*senders)
	results := make(chan item, 2*senders)
	slots := make(chan struct{}, window)
	go b.read(in, work, slots, stop)
	var wg sync.WaitGroup
	for range senders {
		wg.Go(func() { b.send(ctx, work, results, stop) })
	}
	go func() { wg.Wait(); close(results) }()

	r := &report{name: b.name, out: out, bar: bar, slots: slots, pending: map[int]item{}}
	halt := sync.OnceFunc(func() { close(stop) })
	done := ctx.Done()
	for {
		select {
		case it, ok := <-results:
			if !ok {
				return r.finish(b.resume, ctx.Err())
			}
			if it.state == stateFailed || it.state == stateEnd && it.err != nil {
				halt()
			}
			r.add(it)
		case <-done:
			done = nil
			halt()
		}
	}
}

// read reads the input, checks each line and queues it as an item. It
// returns at the end of the input or when stop is closed; it may be blocked
// in a read then, which only a blocked stdin can make last.
func (b *batch) read(in io.Reader, work chan<- item, slots chan<- struct{}, stop <-chan struct{}) {
	defer close(work)
	lr := newLineReader(in, message.MaxPayloadLen)
	seq := 0
	put := func(it item) bool {
		select {
		case slots <- struct{}{}:
		case <-stop:
			return false
		}
		it.seq, seq = seq, seq+1
		select {
		case work <- it:
			return true
		case <-stop:
			return false
		}
	}
	for {
		line, size, err := lr.next()
		if err != nil {
			end := item{line: lr.line, off: lr.off, state: stateEnd}
			if !errors.Is(err, io.EOF) {
				end.err = err
			}
			put(end)
			return
		}
		it := item{line: lr.line, off: lr.off}
		switch {
		case size > lr.max:
			it.state, it.err = stateRejected, fmt.Errorf("line of %d bytes, more than %d", size, lr.max)
		case len(bytes.TrimSpace(line)) == 0:
			continue // blank: skipped, neither counted nor rejected
		default:
			var e intake.Entry
			if e, it.err = intake.ParseLine(line); it.err == nil {
				it.job, it.err = b.check.Check(e, time.Now())
			}
			if it.err != nil {
				it.state = stateRejected
			}
		}
		if !put(it) {
			return
		}
	}
}

// send enqueues the ready items of work and passes every item on to results,
// until work is closed or stop is. An enqueue under way when ctx ends still
// finishes, so that it is known whether it happened.
func (b *batch) send(ctx context.Context, work <-chan item, results chan<- item, stop <-chan struct{}) {
	ctx = context.WithoutCancel(ctx)
	for {
		select {
		case <-stop:
			return
		default:
		}
		select {
		case <-stop:
			return
		case it, ok := <-work:
			if !ok {
				return
			}
			if it.state == stateReady {
				it.state, it.err = b.enqueue(ctx, it.job)
				it.job.Task = nil // done with: not kept while waiting to be reported
			}
			results <- it
		}
	}
}

func (b *batch) enqueue(ctx context.Context, j intake.Job) (state, error) {
	err := b.client.enqueue(ctx, j)
	switch {
	case err == nil:
		return stateEnqueued, nil
	case errors.Is(err, asynq.ErrTaskIDConflict):
		return stateDuplicate, nil
	}
	return stateFailed, err
}

// report writes what happened to the items in line order: each rejected
// line, then, at the end, why it stopped if it did and a summary.
type report struct {
	name  string
	out   *bufio.Writer
	bar   *progress // nil when stderr is not a terminal
	slots <-chan struct{}

	next    int          // seq of the next item to report
	pending map[int]item // items done before an earlier one
	last    item         // the last item reported
	halt    *item        // the failed item reporting stopped at, if any
	after   []int        // lines past the stop enqueued all the same, without an idempotency key
	ended   bool         // the end of the input was reported

	enqueued, duplicates, rejected int
	flushed                        time.Time
}

// add takes one item done and reports every item it completes the order of.
func (r *report) add(it item) {
	if r.halt != nil {
		r.late(it)
		return
	}
	r.pending[it.seq] = it
	for {
		it, ok := r.pending[r.next]
		if !ok {
			break
		}
		delete(r.pending, r.next)
		if it.state == stateFailed || it.state == stateEnd && it.err != nil {
			r.halt = &it
			for _, p := range r.pending {
				r.late(p)
			}
			clear(r.pending)
			break
		}
		r.emit(it)
		r.next++
		<-r.slots
	}
	if now := time.Now(); r.last.line > 0 && now.Sub(r.flushed) >= refresh {
		r.flushed = now
		r.bar.draw(now, r.last, r.enqueued, r.rejected)
		r.out.Flush()
	}
}

// late takes an item done past the point where reporting stopped, which
// resuming enqueues again unless it has an idempotency key.
func (r *report) late(it item) {
	if it.state == stateEnqueued && !it.job.Keyed {
		r.after = append(r.after, it.line)
	}
}

func (r *report) emit(it item) {
	r.last = it
	switch it.state {
	case stateRejected:
		r.rejected++
		r.bar.clear()
		fmt.Fprintf(r.out, "%s:%d: %v\n", r.name, it.line, it.err)
	case stateEnqueued:
		r.enqueued++
	case stateDuplicate:
		r.duplicates++
	case stateEnd:
		r.ended = true
	}
}

// finish writes why enqueueing stopped early, if it did, and the summary,
// and returns errReported unless every line was enqueued (or a duplicate).
// interrupted is why the run's context ended, if it did.
func (r *report) finish(resume func(int) string, interrupted error) error {
	r.bar.clear()
	for _, p := range r.pending { // not reported: their turn never came
		r.late(p)
	}
	if r.ended {
		r.summary(r.last.line)
		if r.rejected > 0 {
			return errReported
		}
		return nil
	}
	from := r.last.line + 1 // lines up to the last reported are done
	switch {
	case r.halt != nil && r.halt.state == stateEnd:
		fmt.Fprintf(r.out, "enqueue: %s: reading line %d: %v\n", r.name, r.halt.line+1, r.halt.err)
		from = r.halt.line + 1
	case r.halt != nil:
		fmt.Fprintf(r.out, "enqueue: %s:%d: %v\n", r.name, r.halt.line, r.halt.err)
		from = r.halt.line
	case interrupted != nil:
		fmt.Fprintf(r.out, "enqueue: interrupted (%v)\n", interrupted)
	}
	done := "no line is done"
	if from > 1 {
		done = fmt.Sprintf("lines 1-%d are done, %d enqueued", from-1, r.enqueued)
	}
	fmt.Fprintf(r.out, "enqueue: stopped: %s; resume from line %d", done, from)
	if cmd := resume(from); cmd != "" {
		fmt.Fprintf(r.out, ": %s", cmd)
	}
	fmt.Fprintln(r.out)
	if len(r.after) > 0 {
		fmt.Fprintf(r.out, "enqueue: %s past line %d, without an idempotency_key, enqueued as well: resuming enqueues them again\n",
			lineList(r.after), from)
	}
	r.summary(from - 1)
	return errReported
}

// summary writes the last line: "enqueued 498, duplicates 1, rejected 1 (500 lines)".
func (r *report) summary(lines int) {
	fmt.Fprintf(r.out, "enqueued %d, duplicates %d, rejected %d (%d lines)\n", r.enqueued, r.duplicates, r.rejected, lines)
}

// lineList lists line numbers in order: "line 7", "lines 7, 9".
func lineList(lines []int) string {
	slices.Sort(lines)
	s := make([]string, len(lines))
	for i, l := range lines {
		s[i] = strconv.Itoa(l)
	}
	if len(s) == 1 {
		return "line " + s[0]
	}
	return "lines " + strings.Join(s, ", ")
}

// resumeHint returns the function that says how to resume the file o names
// from a line, as a shell command.
func resumeHint(o *options) func(line int) string {
	return func(line int) string {
		if o.file == "-" {
			return ""
		}
		cfg := ""
		if o.config != "config.yaml" {
			cfg = "-config " + shellQuote(o.config) + " "
		}
		return fmt.Sprintf("tail -n +%d %s | enqueue %s-file -", line, shellQuote(o.file), cfg)
	}
}

// shellQuote quotes s for a POSIX shell when it needs it.
func shellQuote(s string) string {
	if s != "" && strings.Trim(s, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./+,:@%=") == "" {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
