package continuity

import (
	"encoding/json"
	"testing"
)

// The benchmarks use a realistic 50-item Codex history (60 KB: a
// large developer message, reasoning with ciphertext, tool calls and their
// output).

func benchHistory(b *testing.B) (hist []json.RawMessage, size int64) {
	b.Helper()
	hist = realisticHistory(50)
	return hist, sumLen(hist)
}

// BenchmarkCommit is the HTTP shape: the full input (the 47-item history plus
// one new item) compared against the stored history, then two output items
// inspected and copied.
func BenchmarkCommit(b *testing.B) {
	hist, size := benchHistory(b)
	c := New(Options{})
	input := hist[:48]
	output := hist[48:]
	c.Commit(rootKey, Turn{ResponseID: "resp_0", Input: input[:47]})
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		c.Commit(rootKey, Turn{ResponseID: "resp_1", Input: input, Output: output, AccountID: "acc_1", Organization: "org_a"})
	}
}

// BenchmarkCommitIncremental is the WebSocket shape: previous_response_id and
// only the new item.
func BenchmarkCommitIncremental(b *testing.B) {
	hist, size := benchHistory(b)
	c := New(Options{})
	c.Commit(rootKey, Turn{ResponseID: "resp_0", Input: hist[:47]})
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		c.Commit(rootKey, Turn{ResponseID: "resp_1", PreviousResponseID: "resp_0", Input: hist[47:48], Output: hist[48:], AccountID: "acc_1", Organization: "org_a"})
	}
}

// BenchmarkResolve rebuilds the full input from the last response of a
// 50-item history plus one new item.
func BenchmarkResolve(b *testing.B) {
	hist, size := benchHistory(b)
	c := New(Options{})
	c.Commit(rootKey, Turn{ResponseID: "resp_1", Input: hist})
	newItems := []json.RawMessage{msg("user", "continue")}
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := c.Resolve(rootKey, "resp_1", newItems); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRequestFields reads a full Codex request body with a 50-item
// input.
func BenchmarkRequestFields(b *testing.B) {
	hist, _ := benchHistory(b)
	body := codexBody(hist, "")
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		f, err := RequestFields(body)
		if err != nil || len(f.Input) != 50 {
			b.Fatal(err, len(f.Input))
		}
	}
}

// BenchmarkWithFullInput writes the full 50-item input into a WebSocket
// follow-up body.
func BenchmarkWithFullInput(b *testing.B) {
	hist, _ := benchHistory(b)
	body := codexBody(hist[49:], "resp_1")
	b.SetBytes(int64(len(body)) + sumLen(hist))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := WithFullInput(body, hist); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkSelfContained checks a full 50-item input.
func BenchmarkSelfContained(b *testing.B) {
	hist, size := benchHistory(b)
	f := Fields{Input: hist}
	b.SetBytes(size)
	b.ReportAllocs()
	for b.Loop() {
		if !SelfContained(f) {
			b.Fatal("not self-contained")
		}
	}
}
