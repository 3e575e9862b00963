package web

import (
	"fmt"
	"mime"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/codexrelay/codex-relay/internal/report"
	"github.com/codexrelay/codex-relay/internal/roles"
	"github.com/codexrelay/codex-relay/internal/store"
)

// The default window of a usage report: the last 30 days, and a minute
// ahead so a request logged as the report is asked for is in it.
const (
	usageDefaultSpan  = 30 * 24 * time.Hour
	usageDefaultAhead = time.Minute
)

// usageQuery is GET /usage: the grouping, the window [From, To), the
// filters and the format.
type usageQuery struct {
	Groups                      []report.Group
	From, To                    time.Time
	Key, Account, Model, Thread string
	CSV                         bool
}

// parseUsageQuery reads the parameters of GET /usage. from and to are RFC
// 3339 times, dates (midnight in loc) or unix seconds; they default to 30
// days before now and a minute after it. The answer is CSV with format=csv,
// or with no format and an Accept header asking for text/csv.
func parseUsageQuery(c echo.Context, now time.Time, loc *time.Location) (usageQuery, error) {
	q := usageQuery{Key: query(c, "key"), Account: query(c, "account"), Model: query(c, "model"), Thread: query(c, "thread"),
		From: now.Add(-usageDefaultSpan), To: now.Add(usageDefaultAhead)}
	var err error
	if q.Groups, err = report.ParseGroups(c.QueryParam("group_by")); err != nil {
		return q, badField("group_by", "%v", err)
	}
	for _, p := range []struct {
		name string
		t    *time.Time
	}{{"from", &q.From}, {"to", &q.To}} {
		v := query(c, p.name)
		if v == "" {
			continue
		}
		t, ok := parseReportTime(v, loc)
		if !ok {
			return q, badField(p.name, "must be an RFC 3339 time such as 2026-11-30T00:00:00Z, a date such as 2026-11-30 "+
				"(midnight in %s) or unix seconds", loc)
		}
		*p.t = t
	}
	if !q.To.After(q.From) {
		return q, badField("to", "must be after from (%s)", q.From.In(loc).Format(time.RFC3339))
	}
	switch f := strings.ToLower(query(c, "format")); f {
	case "csv":
		q.CSV = true
	case "json":
	case "":
		q.CSV = acceptsCSV(c.Request().Header.Values("Accept"))
	default:
		return q, badField("format", "must be json or csv")
	}
	return q, nil
}

// Bounds of the times a report accepts, so every one fits the log's unix
// milliseconds.
var (
	minReportTime = time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC)
	maxReportTime = time.Date(9999, 12, 31, 23, 59, 59, 0, time.UTC)
)

// parseReportTime reads unix seconds, an RFC 3339 time or a date (midnight
// in loc). A '+' of an offset that reached the query unencoded (as a space)
// is read as a '+'.
func parseReportTime(v string, loc *time.Location) (time.Time, bool) {
	var t time.Time
	if isDigits(v) {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil {
			return t, false
		}
		t = time.Unix(n, 0)
	} else if r, err := time.Parse(time.RFC3339, strings.ReplaceAll(v, " ", "+")); err == nil {
		t = r
	} else if d, err := time.ParseInLocation(time.DateOnly, v, loc); err == nil {
		t = d
	} else {
		return t, false
	}
	if t.Before(minReportTime) || t.After(maxReportTime) {
		return t, false
	}
	return t, true
}

func isDigits(s string) bool {
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return false
		}
	}
	return s != ""
}

// acceptsCSV reports whether an Accept header asks for text/csv (with a
// non-zero quality).
func acceptsCSV(accept []string) bool {
	for _, h := range accept {
		for _, part := range strings.Split(h, ",") {
			mt, params, err := mime.ParseMediaType(strings.TrimSpace(part))
			if err != nil || mt != "text/csv" {
				continue
			}
			if qv, ok := params["q"]; ok {
				if f, err := strconv.ParseFloat(qv, 64); err != nil || f <= 0 {
					continue
				}
			}
			return true
		}
	}
	return false
}

func (q usageQuery) filter() store.UsageFilter {
	return store.UsageFilter{From: q.From, To: q.To, KeyID: q.Key, AccountID: q.Account, Model: q.Model, ThreadID: q.Thread}
}

// usageFileName names a CSV report after its window, in loc: a bound at
// midnight as its date, any other as date and time (no colons, which some
// file systems refuse).
func usageFileName(from, to time.Time, loc *time.Location) string {
	stamp := func(t time.Time) string {
		t = t.In(loc)
		if t.Hour() == 0 && t.Minute() == 0 && t.Second() == 0 && t.Nanosecond() == 0 {
			return t.Format(time.DateOnly)
		}
		return t.Format("2006-01-02T150405")
	}
	return "usage-" + stamp(from) + "-" + stamp(to) + ".csv"
}

// usageAnswer is the JSON answer of GET /usage.
type usageAnswer struct {
	Rows []report.Row `json:"rows"`
}

// usage answers GET /usage: the request log's usage over a window, grouped,
// as JSON or CSV. The rows are folded into the report as the database
// returns them; the answer is written once the query is done, so a slow
// client never holds a database connection.
func (s *Server) usage(c echo.Context) error {
	loc := s.cfg.Location
	q, err := parseUsageQuery(c, s.cfg.Now(), loc)
	if err != nil {
		return err
	}
	// A report is anyone's to read; the CSV export is an operator's, as
	// the console's download is.
	if q.CSV {
		if err := checkRole(c, roles.Operator); err != nil {
			return err
		}
	}
	agg := report.NewAggregator(q.Groups, loc)
	err = s.cfg.Store.EachUsageRow(c.Request().Context(), q.filter(), func(r store.UsageRow) error {
		agg.Add(r)
		return nil
	})
	if err != nil {
		return err
	}
	rows := agg.Rows()
	if !q.CSV {
		return c.JSON(http.StatusOK, usageAnswer{Rows: rows})
	}
	h := c.Response().Header()
	h.Set(echo.HeaderContentType, "text/csv; charset=utf-8")
	h.Set(echo.HeaderContentDisposition, fmt.Sprintf(`attachment; filename="%s"`, usageFileName(q.From, q.To, loc)))
	c.Response().WriteHeader(http.StatusOK)
	return report.WriteCSV(c.Response(), q.Groups, rows)
}
