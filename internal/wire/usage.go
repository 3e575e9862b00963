package wire

// Usage is a response's usage object as the Responses API reports it:
// InputTokens includes the cached ones, OutputTokens the reasoning ones.
type Usage struct {
	InputTokens        int64 `json:"input_tokens"`
	OutputTokens       int64 `json:"output_tokens"`
	TotalTokens        int64 `json:"total_tokens"`
	InputTokensDetails *struct {
		CachedTokens int64 `json:"cached_tokens"`
	} `json:"input_tokens_details"`
	OutputTokensDetails *struct {
		ReasoningTokens int64 `json:"reasoning_tokens"`
	} `json:"output_tokens_details"`
}

// Cached is the cached input tokens (0 when not reported).
func (u Usage) Cached() int64 {
	if u.InputTokensDetails == nil {
		return 0
	}
	return u.InputTokensDetails.CachedTokens
}

// Reasoning is the reasoning tokens among the output (0 when not reported).
func (u Usage) Reasoning() int64 {
	if u.OutputTokensDetails == nil {
		return 0
	}
	return u.OutputTokensDetails.ReasoningTokens
}

// Total is the reported total_tokens, or input plus output when the
// upstream gave none.
func (u Usage) Total() int64 {
	if u.TotalTokens != 0 {
		return u.TotalTokens
	}
	return u.InputTokens + u.OutputTokens
}
