package local

// HostInterface is the name of sandbox id's host veth end, for tests.
func HostInterface(id string) string {
	host, _ := linkNames(id)
	return host
}

// CgroupRoots is cgroupRoots, for tests: where a cgroup path lives on this
// host's layout.
func CgroupRoots() []string { return cgroupRoots() }

// StateFSSource is the source name of the tmpfs for state directories.
const StateFSSource = stateFSSource
