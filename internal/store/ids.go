package store

import (
	"crypto/rand"
	"encoding/base32"
	"encoding/binary"
	"strings"
	"time"
)

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

// NewID returns prefix_ followed by 26 characters: 48 bits of Unix
// milliseconds then 80 random bits, so ids sort by creation time and never
// collide in practice.
func NewID(prefix string, now time.Time) string {
	var b [16]byte
	binary.BigEndian.PutUint64(b[:8], uint64(now.UnixMilli())<<16)
	if _, err := rand.Read(b[6:]); err != nil {
		panic("crypto/rand failed: " + err.Error()) // the platform is broken; nothing sane to do
	}
	return prefix + "_" + strings.ToLower(idEncoding.EncodeToString(b[:]))
}

// millis converts a time to the BIGINT stored in the database; the zero
// time is NULL.
func millis(t time.Time) *int64 {
	if t.IsZero() {
		return nil
	}
	v := t.UnixMilli()
	return &v
}

// fromMillis is the inverse of millis.
func fromMillis(v *int64) time.Time {
	if v == nil {
		return time.Time{}
	}
	return time.UnixMilli(*v).UTC()
}
