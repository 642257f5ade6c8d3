// Command fake-cri serves Kubernetes' in-memory fake container runtime on a unix socket so a real
// kubelet can admit and "run" pods without containerd, and records what the kubelet asked for.
//
// WHY: the end-to-end tier must prove that the env our device plugin answers at Allocate reaches
// the container. The kubelet hands it to the runtime in CreateContainer, so this runtime appends
// one JSON line per CreateContainer (pod, container, env, mounts, devices) to -log. Everything
// else is k8s.io/cri-client's fake RemoteRuntime, unchanged, except that pulled images have a
// size (the kubelet rejects size 0) and each container gets a real log file (the stock fake leaves
// the path empty, and the kubelet's log cleanup then works relative to its own working directory).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"google.golang.org/grpc"
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
	Env         map[string]string `json:"env"`
	Mounts      []mount           `json:"mounts"`
	Devices     []device          `json:"devices"`
	Annotations map[string]string `json:"annotations"`
}

type recorder struct {
	mu      sync.Mutex
	out     *os.File
	runtime *fake.RemoteRuntime
}

func (r *recorder) intercept(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if err != nil || !strings.HasSuffix(info.FullMethod, "/CreateContainer") {
		return resp, err
	}
	create := req.(*kubeapi.CreateContainerRequest)
	id := resp.(*kubeapi.CreateContainerResponse).ContainerId
	r.giveLogFile(id, create)
	r.record(id, create)
	return resp, nil
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

func (r *recorder) record(id string, create *kubeapi.CreateContainerRequest) {
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
		Mounts:      []mount{},
		Devices:     []device{},
		Annotations: cfg.GetAnnotations(),
	}
	for _, kv := range cfg.GetEnvs() {
		rec.Env[kv.GetKey()] = string(kv.GetValue())
	}
	for _, m := range cfg.GetMounts() {
		rec.Mounts = append(rec.Mounts, mount{m.GetContainerPath(), m.GetHostPath(), m.GetReadonly()})
	}
	for _, d := range cfg.GetDevices() {
		rec.Devices = append(rec.Devices, device{d.GetContainerPath(), d.GetHostPath(), d.GetPermissions()})
	}
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
	flag.Parse()
	if *socket == "" || *logPath == "" {
		log.Fatal("usage: fake-cri -socket PATH -log PATH")
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
	rec := &recorder{out: out, runtime: runtime}
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
	log.Printf("fake CRI serving on %s, recording CreateContainer to %s", *socket, *logPath)
	if err := server.Serve(listener); err != nil {
		log.Fatal(err)
	}
	_ = out.Close()
	_ = os.Remove(*socket)
}
