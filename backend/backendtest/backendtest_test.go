package backendtest_test

import (
	"testing"

	"github.com/throttlekit/throttlekit/backend/backendtest"
	"github.com/throttlekit/throttlekit/backend/backendtest/internal/model"
)

// The models pass the suite: its hand-computed tables agree with the
// contract as the model reads it.
func TestLeaseModelPassesRunLeases(t *testing.T) {
	store := struct {
		*model.Model
		*model.LeaseModel
	}{model.NewModel(), model.NewLeaseModel()}
	backendtest.RunLeases(t, func(*testing.T) backendtest.LeaseStore { return store })
}
