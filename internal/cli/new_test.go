package cli

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestNewHelpAndBadInvocations(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"help", "new"}, {"new", "-h"}, {"new", "service", "x", "--help"}} {
		stdout, _, err := run(t, args...)
		require.NoError(t, err, args)
		require.Contains(t, stdout, "Usage: onceflow new service NAME [--consumes EVENT...] [--emits EVENT] [--dir DIR]", args)
		require.Contains(t, stdout, "-consumes EVENT", args)
	}
	dir := t.TempDir()
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"new"}, "new: want 'onceflow new service NAME [--consumes EVENT...] [--emits EVENT]' (see 'onceflow help new')"},
		{[]string{"new", "service"}, "new: want 'onceflow new service NAME"},
		{[]string{"new", "handler", "x"}, "new: want 'onceflow new service NAME"},
		{[]string{"new", "service", "a", "b"}, "new: want 'onceflow new service NAME"},
		{[]string{"new", "service", "x", "--bogus"}, "new: flag provided but not defined: -bogus"},
		{[]string{"new", "service", "x", "--dir", dir}, "is not the root of the onceflow repository"},
		{[]string{"new", "service", "Loyalty", "--dir", "../.."}, `new service: service name "Loyalty": want a lowercase Go identifier`},
		{[]string{"new", "service", "migrate", "--dir", "../.."}, `new service: service name "migrate": taken by a command`},
		{[]string{"new", "service", "payment", "--dir", "../.."}, `new service: service "payment" exists`},
		{[]string{"new", "service", "loyalty", "--consumes", "Nope", "--dir", "../.."}, `unknown event "Nope"`},
		{[]string{"new", "service", "loyalty", "--consumes", "OrderConfirmed", "--emits", "OrderPlaced", "--dir", "../.."}, "emitted event OrderPlaced exists"},
		{[]string{"new", "service", "loyalty", "--consumes", "OrderConfirmed", "--emits", "points", "--dir", "../.."}, `emitted event "points": want an exported Go identifier`},
		{[]string{"new", "service", "loyalty", "--emits", "PointsAwarded", "--dir", "../.."}, "name one with --consumes"},
	}
	for _, tt := range tests {
		_, _, err := run(t, tt.args...)
		require.ErrorContains(t, err, tt.want, tt.args)
	}
}

func TestSplitNewArgs(t *testing.T) {
	t.Parallel()
	tests := []struct {
		args             []string
		flags, positions []string
	}{
		{
			[]string{"service", "loyalty", "--consumes", "A", "B", "--dir", "x"},
			[]string{"--consumes", "A", "--consumes", "B", "--dir", "x"},
			[]string{"service", "loyalty"},
		},
		{
			[]string{"--dir=x", "service", "--consumes=A,B", "loyalty"},
			[]string{"--dir=x", "--consumes=A,B"},
			[]string{"service", "loyalty"},
		},
		{
			[]string{"service", "--consumes", "A", "--consumes", "C", "--", "loyalty"},
			[]string{"--consumes", "A", "--consumes", "C"},
			[]string{"service", "loyalty"},
		},
	}
	for _, tt := range tests {
		fs := flagSet("new", "", "")
		fs.String("dir", ".", "")
		fs.Func("consumes", "", func(string) error { return nil })
		flags, positional := splitNewArgs(fs, tt.args)
		require.Equal(t, tt.flags, flags, tt.args)
		require.Equal(t, tt.positions, positional, tt.args)
	}
}
