package main

// event kinds of the virtual-time driver.
const (
	evSync  = iota // a node starts a sync cycle
	evApply        // a paced cycle's request reaches the store
	evReply        // a paced cycle's reply reaches the node
	evClock        // every node measures its offset to the store's clock
	evEvict        // every node evicts idle keys
	evLeave        // churn: nodes leave
	evJoin         // churn: they come back as new nodes
)

type event struct {
	at   int64 // ns from the start
	seq  uint64
	kind int
	node int
	gen  int
}

type events []event

func (h events) Len() int { return len(h) }
func (h events) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h events) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *events) Push(x any)   { *h = append(*h, x.(event)) }
func (h *events) Pop() any {
	old := *h
	e := old[len(old)-1]
	*h = old[:len(old)-1]
	return e
}
