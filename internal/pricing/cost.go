package pricing

import (
	"math"
	"math/bits"
)

// Usage is what a response reported using, as OpenAI counts it: Input
// includes the CachedInput tokens, and Output includes reasoning tokens.
// Images is the number of images an images answer returned.
type Usage struct {
	Input, CachedInput, Output int64
	Images                     int64
}

// Cost prices u at model and tier (see Lookup), in billionths of a US
// dollar ("nanos"), rounded to the nearest; ok is false, and nanos 0, when
// no entry prices the model.
func (t Table) Cost(model, tier string, u Usage) (nanos int64, ok bool) {
	e, ok := t.Lookup(model, tier)
	if !ok {
		return 0, false
	}
	return e.Cost(u), true
}

// Cost prices u at e, in billionths of a US dollar rounded to the nearest
// (half up): the uncached input, the cached input and the output, each at
// its price per million tokens, and the images at the price per image.
// Cached tokens are clamped to [0, Input], negative counts to 0.
//
// Each price is first taken to the millionth of a dollar per million
// tokens, and the sum is then worked out in integers, so figures that are
// exact stay exact (a million input tokens at 1.25 is 1,250,000,000 nanos,
// not one off) and no total is lost to float rounding. A cost past the
// int64 range is capped at math.MaxInt64. Prices outside Validate's bounds
// are clamped to them.
func (e Entry) Cost(u Usage) int64 {
	in, cached, out := max(u.Input, 0), u.CachedInput, max(u.Output, 0)
	cached = min(max(cached, 0), in)
	// sum is tokens × micro-dollars per million tokens, in thousandths of
	// a nano: at most 3 × 2^63 × 10^11, well inside 128 bits.
	var hi, lo uint64
	add := func(tokens int64, price float64) {
		h, l := bits.Mul64(uint64(tokens), micros(price))
		var carry uint64
		lo, carry = bits.Add64(lo, l, 0)
		hi += h + carry
	}
	add(in-cached, e.Input)
	add(cached, e.CachedInput)
	add(out, e.Output)
	// An image at p dollars is a million tokens at p dollars per million.
	if n := max(u.Images, 0); n > 0 {
		h, l := bits.Mul64(uint64(n), micros(min(e.PerImage, MaxImagePrice)))
		h2, l2 := bits.Mul64(l, 1e6)
		h = h*1e6 + h2
		var carry uint64
		lo, carry = bits.Add64(lo, l2, 0)
		hi += h + carry
	}
	var carry uint64
	lo, carry = bits.Add64(lo, 500, 0) // round half up
	hi += carry
	if hi >= 1000 {
		return math.MaxInt64
	}
	q, _ := bits.Div64(hi, lo, 1000)
	if q > math.MaxInt64 {
		return math.MaxInt64
	}
	return int64(q)
}

// micros is a price per million tokens in millionths of a dollar, within
// Validate's bounds (NaN is 0).
func micros(price float64) uint64 {
	if !(price > 0) {
		return 0
	}
	return uint64(math.Round(min(price, MaxPrice) * 1e6))
}
