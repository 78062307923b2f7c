package shed

import (
	"errors"
	"strings"
)

var errNilShedder = errors.New("shed: called on a shedder that its constructor did not build")

// reworded is a throttler error given this package's context: one package
// prefix per message ("shed: Options.Rate: invalid policy: …"), while
// errors.Is still finds what it wraps.
type reworded struct {
	msg string
	err error
}

func (e *reworded) Error() string { return e.msg }
func (e *reworded) Unwrap() error { return e.err }

func reword(context string, err error) error {
	return &reworded{msg: "shed: " + context + ": " + strings.TrimPrefix(err.Error(), "throttler: "), err: err}
}
