// Command fake-cri serves Kubernetes' in-memory fake container runtime on a unix socket so a real
// kubelet can admit and "run" pods without containerd, and records what the kubelet asked for.
//
// WHY: the end-to-end tier must prove that the env our device plugin answers at Allocate reaches
// the container. The kubelet hands it to the runtime in CreateContainer, so this runtime appends
// one JSON line per CreateContainer (pod, container, env, mounts, devices) to -log. Everything
// else is k8s.io/cri-client's fake RemoteRuntime, unchanged, except that pulled images have a
// size (the kubelet rejects size 0) and each container gets a real log file (the stock fake leaves
// the path empty, and the kubelet's log cleanup then works relative to its own working directory).
//
// The recorded env and mounts are the effective ones, what a container of containerd or CRI-O would
// get: the CRI config's envs in order (the kubelet sends the device plugin's envs, then the container's
// own env and envFrom), the last of two same-named ones kept; then the edits of each CDI device the
// config names (CDI_devices, from the device plugin's Allocate answer), read from the CDI spec files
// in -cdi-spec-dirs as the CDI library reads them (.json files; a later directory wins; a spec that
// does not validate, or a device two specs of one directory declare, resolves to nothing): the spec's
// own containerEdits, then the device's, each variable after the container's own (the CDI library
// appends; runc keeps the last of a name) and each mount replacing the one at the same container path. A device that does not resolve fails CreateContainer, as
// "unresolvable CDI devices" does in containerd. The record keeps the CRI config's env as criEnv and
// the CDI names as cdiDevices. Only env and mounts are applied (the plugin writes nothing else); YAML
// spec files are not read.
//
// The record's gpus are what NVIDIA's container toolkit would give the container, by its configuration
// (-nvidia-toolkit-config, read at every CreateContainer as the toolkit reads it at every container start;
// absent: the toolkit's defaults): the /dev/null mounts under /var/run/nvidia-container-devices where it
// accepts volume mounts and there are some; else NVIDIA_VISIBLE_DEVICES of the effective environment where
// the container is privileged or the toolkit accepts the variable from unprivileged ones ("void", "none"
// and empty: no GPU); plus every CDI device of kind nvidia.com/gpu. Only the two top-level keys that
// decide this are read (accept-nvidia-visible-devices-envvar-when-unprivileged,
// accept-nvidia-visible-devices-as-volume-mounts).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	kubeapi "k8s.io/cri-api/pkg/apis/runtime/v1"
	"k8s.io/cri-client/pkg/fake"
)

type mount struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	ReadOnly      bool   `json:"readOnly"`
}

type device struct {
	ContainerPath string `json:"containerPath"`
	HostPath      string `json:"hostPath"`
	Permissions   string `json:"permissions"`
}

type createRecord struct {
	Namespace   string            `json:"namespace"`
	Pod         string            `json:"pod"`
	PodUID      string            `json:"podUid"`
	Container   string            `json:"container"`
	ContainerID string            `json:"containerId"`
	Attempt     uint32            `json:"attempt"`
	Env         map[string]string `json:"env"`    // effective: the CRI envs, then the CDI devices' edits
	CRIEnv      map[string]string `json:"criEnv"` // the CRI config's envs alone (the last of a name kept)
	CDIDevices  []string          `json:"cdiDevices"`
	Mounts      []mount           `json:"mounts"` // effective, like Env
	Devices     []device          `json:"devices"`
	Annotations map[string]string `json:"annotations"`
	Privileged  bool              `json:"privileged"`
	GPUs        []string          `json:"gpus"` // what NVIDIA's toolkit would give the container
}

type recorder struct {
	mu       sync.Mutex
	out      *os.File
	runtime  *fake.RemoteRuntime
	specDirs []string
	toolkit  string // the NVIDIA toolkit's configuration file
}

const (
	deviceMountRoot = "/var/run/nvidia-container-devices"
	nvidiaCDIKind   = "nvidia.com/gpu"
)

// toolkitConfig reads the two settings that decide which GPUs a container gets; the toolkit's defaults
// (variable accepted, mounts not) where the file or a key is missing.
func toolkitConfig(path string) (acceptEnvvar, acceptMounts bool) {
	acceptEnvvar, acceptMounts = true, false
	data, err := os.ReadFile(path)
	if err != nil {
		return
	}
	for _, line := range strings.Split(string(data), "\n") {
		line = strings.TrimSpace(line)
		if strings.HasPrefix(line, "[") {
			break // a table: the keys that follow are not top-level
		}
		key, value, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		on := strings.TrimSpace(value) == "true"
		switch strings.TrimSpace(key) {
		case "accept-nvidia-visible-devices-envvar-when-unprivileged":
			acceptEnvvar = on
		case "accept-nvidia-visible-devices-as-volume-mounts":
			acceptMounts = on
		}
	}
	return
}

// toolkitGPUs is the toolkit's device request for the container (see the package comment).
func (r *recorder) toolkitGPUs(rec *createRecord) []string {
	acceptEnvvar, acceptMounts := toolkitConfig(r.toolkit)
	gpus := []string{}
	if acceptMounts {
		for _, m := range rec.Mounts {
			if m.HostPath == "/dev/null" && strings.HasPrefix(m.ContainerPath, deviceMountRoot+"/") {
				gpus = append(gpus, strings.TrimPrefix(m.ContainerPath, deviceMountRoot+"/"))
			}
		}
	}
	if value := rec.Env["NVIDIA_VISIBLE_DEVICES"]; len(gpus) == 0 && (rec.Privileged || acceptEnvvar) {
		if value != "" && value != "void" && value != "none" {
			gpus = append(gpus, strings.Split(value, ",")...)
		}
	}
	for _, name := range rec.CDIDevices {
		if kind, id, ok := strings.Cut(name, "="); ok && kind == nvidiaCDIKind {
			gpus = append(gpus, id)
		}
	}
	return gpus
}

func (r *recorder) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if !strings.HasSuffix(info.FullMethod, "/CreateContainer") {
		return handler(ctx, req)
	}
	create := req.(*kubeapi.CreateContainerRequest)
	edits, err := resolveCDI(r.specDirs, create.GetConfig().GetCDIDevices())
	if err != nil {
		log.Printf("CreateContainer %s: %v", create.GetConfig().GetMetadata().GetName(), err)
		return nil, status.Errorf(codes.Unknown, "CDI device injection failed: %v", err)
	}
	resp, err := handler(ctx, req)
	if err != nil {
		return resp, err
	}
	id := resp.(*kubeapi.CreateContainerResponse).ContainerId
	r.giveLogFile(id, create)
	r.record(id, create, edits)
	return resp, nil
}

// --- CDI, as the runtime applies it -------------------------------------------------------------

type cdiMount struct {
	HostPath      string   `json:"hostPath"`
	ContainerPath string   `json:"containerPath"`
	Options       []string `json:"options,omitempty"`
}

type cdiEdits struct {
	Env    []string   `json:"env,omitempty"`
	Mounts []cdiMount `json:"mounts,omitempty"`
}

type cdiSpec struct {
	Version string `json:"cdiVersion"`
	Kind    string `json:"kind"`
	Devices []struct {
		Name           string   `json:"name"`
		ContainerEdits cdiEdits `json:"containerEdits"`
	} `json:"devices"`
	ContainerEdits cdiEdits `json:"containerEdits"`
}

type cdiDevice struct {
	priority int // the index of its spec directory: a later directory wins
	file     string
	edits    []cdiEdits // the spec's, then the device's
	conflict bool       // declared twice at the same priority: resolves to nothing
}

var (
	cdiVersions = map[string]bool{"0.3.0": true, "0.4.0": true, "0.5.0": true, "0.6.0": true, "0.7.0": true, "0.8.0": true}
	cdiVendor   = regexp.MustCompile(`^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
	cdiClass    = regexp.MustCompile(`^[A-Za-z](?:[A-Za-z0-9_.-]*[A-Za-z0-9])?$`)
	cdiName     = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9_.:-]*[A-Za-z0-9])?$`)
)

// validate is the CDI library's check of a spec, for the fields this runtime reads.
func (s *cdiSpec) validate() error {
	if !cdiVersions[s.Version] {
		return fmt.Errorf("invalid version %q", s.Version)
	}
	vendor, class, ok := strings.Cut(s.Kind, "/")
	if !ok || !cdiVendor.MatchString(vendor) || !cdiClass.MatchString(class) {
		return fmt.Errorf("invalid kind %q", s.Kind)
	}
	if len(s.Devices) == 0 {
		return fmt.Errorf("no devices")
	}
	for _, d := range s.Devices {
		if !cdiName.MatchString(d.Name) {
			return fmt.Errorf("invalid device name %q", d.Name)
		}
		first := d.Name[0]
		letter := ('A' <= first && first <= 'Z') || ('a' <= first && first <= 'z')
		if !letter && s.Version < "0.5.0" { // a name starting with a digit needs spec 0.5.0
			return fmt.Errorf("device name %q needs cdiVersion 0.5.0, the spec says %s", d.Name, s.Version)
		}
		if len(d.ContainerEdits.Env) == 0 && len(d.ContainerEdits.Mounts) == 0 {
			return fmt.Errorf("device %q: no container edits this runtime applies", d.Name)
		}
		for _, e := range [][]string{s.ContainerEdits.Env, d.ContainerEdits.Env} {
			for _, v := range e {
				if strings.IndexByte(v, '=') <= 0 {
					return fmt.Errorf("device %q: invalid environment variable %q", d.Name, v)
				}
			}
		}
		for _, m := range append(append([]cdiMount{}, s.ContainerEdits.Mounts...), d.ContainerEdits.Mounts...) {
			if m.HostPath == "" || m.ContainerPath == "" {
				return fmt.Errorf("device %q: invalid mount %+v", d.Name, m)
			}
		}
	}
	return nil
}

// cdiRegistry reads every spec file, fresh for each container (the runtime refreshes its cache before
// injecting); a file that cannot be read or does not validate is logged and skipped.
func cdiRegistry(dirs []string) map[string]*cdiDevice {
	devices := map[string]*cdiDevice{}
	for priority, dir := range dirs {
		files, _ := filepath.Glob(filepath.Join(dir, "*.json"))
		sort.Strings(files)
		for _, file := range files {
			raw, err := os.ReadFile(file)
			if err != nil {
				log.Printf("CDI spec %s: %v", file, err)
				continue
			}
			var spec cdiSpec
			if err := json.Unmarshal(raw, &spec); err != nil {
				log.Printf("CDI spec %s: %v", file, err)
				continue
			}
			if err := spec.validate(); err != nil {
				log.Printf("CDI spec %s: %v", file, err)
				continue
			}
			for _, d := range spec.Devices {
				name := spec.Kind + "=" + d.Name
				if seen, ok := devices[name]; ok && seen.priority == priority {
					log.Printf("CDI device %s: declared by %s and %s", name, seen.file, file)
					seen.conflict = true
					continue
				}
				devices[name] = &cdiDevice{priority: priority, file: file, edits: []cdiEdits{spec.ContainerEdits, d.ContainerEdits}}
			}
		}
	}
	return devices
}

// resolveCDI returns the edits of each named device in order, or the error naming those that do not resolve.
func resolveCDI(dirs []string, names []*kubeapi.CDIDevice) ([]cdiEdits, error) {
	if len(names) == 0 {
		return nil, nil
	}
	devices := cdiRegistry(dirs)
	var edits []cdiEdits
	var unresolved []string
	for _, n := range names {
		d, ok := devices[n.GetName()]
		if !ok || d.conflict {
			unresolved = append(unresolved, n.GetName())
			continue
		}
		edits = append(edits, d.edits...)
	}
	if len(unresolved) > 0 {
		return nil, fmt.Errorf("unresolvable CDI devices %s (spec dirs %v)", strings.Join(unresolved, ", "), dirs)
	}
	return edits, nil
}

// setEnv replaces the variable of the same name in place, or appends it (containerd's
// replaceOrAppendEnvValues, the CDI library's AddMultipleProcessEnv).
func setEnv(env []string, kv string) []string {
	key, _, _ := strings.Cut(kv, "=")
	for i, e := range env {
		if k, _, _ := strings.Cut(e, "="); k == key {
			env[i] = kv
			return env
		}
	}
	return append(env, kv)
}

func (r *recorder) giveLogFile(id string, create *kubeapi.CreateContainerRequest) {
	dir := create.GetSandboxConfig().GetLogDirectory()
	if dir == "" || create.GetConfig().GetLogPath() == "" {
		return
	}
	path := filepath.Join(dir, create.GetConfig().GetLogPath())
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		log.Printf("log dir for %s: %v", id, err)
		return
	}
	if f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY, 0o644); err == nil {
		_ = f.Close()
	}
	svc := r.runtime.RuntimeService
	svc.Lock()
	defer svc.Unlock()
	if c, ok := svc.Containers[id]; ok {
		c.LogPath = path
	}
}

func (r *recorder) record(id string, create *kubeapi.CreateContainerRequest, edits []cdiEdits) {
	cfg := create.GetConfig()
	meta := create.GetSandboxConfig().GetMetadata()
	rec := createRecord{
		Namespace:   meta.GetNamespace(),
		Pod:         meta.GetName(),
		PodUID:      meta.GetUid(),
		Container:   cfg.GetMetadata().GetName(),
		ContainerID: id,
		Attempt:     cfg.GetMetadata().GetAttempt(),
		Env:         map[string]string{},
		CRIEnv:      map[string]string{},
		CDIDevices:  []string{},
		Mounts:      []mount{},
		Devices:     []device{},
		Annotations: cfg.GetAnnotations(),
		Privileged:  cfg.GetLinux().GetSecurityContext().GetPrivileged(),
	}
	env := []string{}
	for _, kv := range cfg.GetEnvs() {
		rec.CRIEnv[kv.GetKey()] = string(kv.GetValue())
		env = setEnv(env, kv.GetKey()+"="+string(kv.GetValue()))
	}
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, mount{m.GetContainerPath(), m.GetHostPath(), m.GetReadonly()})
	}
	for _, d := range cfg.GetCDIDevices() {
		rec.CDIDevices = append(rec.CDIDevices, d.GetName())
	}
	for _, e := range edits {
		for _, kv := range e.Env {
			env = setEnv(env, kv)
		}
		for _, m := range e.Mounts {
			kept := rec.Mounts[:0]
			for _, have := range rec.Mounts {
				if have.ContainerPath != m.ContainerPath {
					kept = append(kept, have)
				}
			}
			readOnly := false
			for _, o := range m.Options {
				readOnly = readOnly || o == "ro"
			}
			rec.Mounts = append(kept, mount{m.ContainerPath, m.HostPath, readOnly})
		}
	}
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		rec.Env[k] = v
	}
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, device{d.GetContainerPath(), d.GetHostPath(), d.GetPermissions()})
	}
	rec.GPUs = r.toolkitGPUs(&rec)
	line, err := json.Marshal(rec)
	if err != nil {
		log.Printf("encode record: %v", err)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, err := r.out.Write(append(line, '\n')); err != nil {
		log.Printf("write record: %v", err)
	}
}

func main() {
	socket := flag.String("socket", "", "unix socket path to serve the CRI on")
	logPath := flag.String("log", "", "file that receives one JSON line per CreateContainer")
	specDirs := flag.String("cdi-spec-dirs", "", "CDI spec directories, separated by commas, later ones winning "+
		"(default: the directory cdi beside -log, the one the e2e harness gives the device plugin)")
	toolkit := flag.String("nvidia-toolkit-config", "/etc/nvidia-container-runtime/config.toml",
		"NVIDIA container toolkit configuration deciding the record's gpus")
	flag.Parse()
	if *socket == "" || *logPath == "" {
		log.Fatal("usage: fake-cri -socket PATH -log PATH [-cdi-spec-dirs DIR,...]")
	}
	dirs := strings.Split(*specDirs, ",")
	if *specDirs == "" {
		dirs = []string{filepath.Join(filepath.Dir(*logPath), "cdi")}
	}
	out, err := os.OpenFile(*logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		log.Fatal(err)
	}
	runtime := fake.NewFakeRemoteRuntime()
	// The kubelet refuses a pulled image whose size is 0, the stock fake's default.
	runtime.ImageService.SetFakeImageSize(64 << 20)
	runtime.RuntimeService.FakeStatus = &kubeapi.RuntimeStatus{Conditions: []*kubeapi.RuntimeCondition{
		{Type: kubeapi.RuntimeReady, Status: true},
		{Type: kubeapi.NetworkReady, Status: true},
	}}
	rec := &recorder{out: out, runtime: runtime, specDirs: dirs, toolkit: *toolkit}
	server := grpc.NewServer(grpc.UnaryInterceptor(rec.intercept))
	kubeapi.RegisterRuntimeServiceServer(server, runtime)
	kubeapi.RegisterImageServiceServer(server, runtime)

	_ = os.Remove(*socket)
	listener, err := net.Listen("unix", *socket)
	if err != nil {
		log.Fatal(err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-stop
		server.Stop()
	}()
	log.Printf("fake CRI serving on %s, recording CreateContainer to %s, CDI specs from %v", *socket, *logPath, dirs)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
	_ = out.Close()
	_ = os.Remove(*socket)
}
