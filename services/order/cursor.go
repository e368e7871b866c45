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

func parseCursor(s string) (cursor, error) {
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != 8+16 {
		return cursor{}, errors.New("not a cursor of this API")
	}
	id, err := uuid.FromBytes(b[8:])
	if err != nil {
		return cursor{}, err
	}
	return cursor{createdAt: time.UnixMicro(int64(binary.BigEndian.Uint64(b[:8]))).UTC(), id: id}, nil
}
