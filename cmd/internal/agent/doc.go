// Package agent holds the parts of sluiced between calc and the stages: the Planner (calc run
// on the event stream, its updates handed to the dataplane and the service stage, in one order
// with the state kept by the last run), the format of that kept state (SaveState,
// RestoreState), and the ServiceStage supervisor (the eBPF stage started with backoff beside
// the routes, its readiness said). cmd/sluiced wires them; this package logs through the
// logger it is given and counts nothing itself.
package agent
