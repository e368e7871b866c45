package order

import (
	"encoding/base64"
	"encoding/binary"
	"errors"
	"time"

	"github.com/google/uuid"
)

// cursor is where a page of GET /orders ends: the created_at and id of its
// last order, the next page starting below them. Clients get it opaque
// (base64url of 8 bytes of microseconds and the 16 bytes of the id), so
// that its form can change.
type cursor struct {
	createdAt time.Time
	id        uuid.UUID
}

// firstPage is the cursor of a first page: above every order.
var firstPage = cursor{createdAt: time.Date(9999, 12, 31, 0, 0, 0, 0, time.UTC), id: uuid.Max}

func (c cursor) String() string {
	b := binary.BigEndian.AppendUint64(nil, uint64(c.createdAt.UnixMicro()))
	return base64.RawURLEncoding.EncodeToString(append(b, c.id[:]...))
}

// parseCursor reads a cursor that String wrote, or one that could be: its
// time between the years 1 and 9999, as any order's is, so that none
// reaches PostgreSQL out of its timestamps' range (a 500's error).
func parseCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 8+16 {
		return cursor{}, errNotACursor
	}
	id, err := uuid.FromBytes(b[8:])
	if err != nil {
		return cursor{}, errNotACursor
	}
	micros := int64(binary.BigEndian.Uint64(b[:8]))
	if micros < minCursorTime.UnixMicro() || micros > firstPage.createdAt.UnixMicro() {
		return cursor{}, errNotACursor
	}
	return cursor{createdAt: time.UnixMicro(micros).UTC(), id: id}, nil
}

// errNotACursor is a next= that no page of GET /orders wrote.
var errNotACursor = errors.New("not a cursor of this API")

// minCursorTime is the earliest time a cursor may name.
var minCursorTime = time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC)
