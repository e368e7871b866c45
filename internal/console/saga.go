package console

import (
	"fmt"
	"strings"
	"time"
)

// The geometry of the saga picture, in SVG user units.
const (
	laneWidth = 210
	laneLeft  = 110
	rowHeight = 44
	sagaTop   = 56
)

// sagaPicture is what the template draws: lanes and arrows.
type sagaPicture struct {
	Width, Height int
	Lanes         []sagaLane
	Arrows        []sagaArrow
}

type sagaLane struct {
	Name string
	X    int
}

type sagaArrow struct {
	X1, X2, Y, LabelX int
	Label             string // the event and its time
	Latency           string // the hop's, at the arrow's head
	Class             string // "", "compensation", "rejection", "pending"
	Late              string // the fate of a late reply, or ""
	Title             string // the tooltip
}

// drawSaga lays hops out: a lane per service, an arrow per hop, one row
// each, top to bottom in the order they happened.
func drawSaga(hops []hop) sagaPicture {
	p := sagaPicture{Width: laneLeft*2 + laneWidth*(len(services)-1), Height: sagaTop + rowHeight*(len(hops)+1)}
	for _, name := range services {
		p.Lanes = append(p.Lanes, sagaLane{Name: name, X: laneX(name)})
	}
	for i, h := range hops {
		a := sagaArrow{
			X1: laneX(h.From), X2: laneX(h.To), Y: sagaTop + rowHeight*(i+1),
			Label: fmt.Sprintf("%s  %s", shortType(string(h.Type)), h.At.UTC().Format("15:04:05.000")),
			Class: h.Kind,
			Late:  h.Late,
			Title: fmt.Sprintf("%s %s → %s", h.Type, h.EventID, h.Durable),
		}
		a.LabelX = min(a.X1, a.X2) + 8
		switch {
		case h.Pending:
			a.Class, a.Latency = "pending", "not processed"
		default:
			a.Latency = "+" + formatLatency(h.Latency())
		}
		if h.Reason != "" {
			a.Title += ": " + h.Reason
		}
		if h.Late != "" {
			a.Title += " (late: the order was over; " + h.Late + ")"
		}
		p.Arrows = append(p.Arrows, a)
	}
	return p
}

func laneX(service string) int { return laneLeft + laneWidth*lane(service) }

// shortType is "PaymentDebited" for "onceflow.payment.debited.v1".
func shortType(typ string) string {
	parts := strings.Split(typ, ".")
	if len(parts) != 4 {
		return typ
	}
	name := map[string]string{"order": "Order", "payment": "Payment", "inventory": "Stock"}[parts[1]]
	return name + strings.ToUpper(parts[2][:1]) + parts[2][1:]
}

func formatLatency(d time.Duration) string {
	switch {
	case d < 0:
		return "0 ms"
	case d < 10*time.Second:
		return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000)
	}
	return d.Round(100 * time.Millisecond).String()
}
