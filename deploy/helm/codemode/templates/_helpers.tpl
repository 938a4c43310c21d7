{{- define "codemode.fullname" -}}
{{- printf "%s-codemode" .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "codemode.labels" -}}
app.kubernetes.io/name: codemode
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "codemode.selector" -}}
app.kubernetes.io/name: codemode
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "codemode.clusterSecretName" -}}
{{- .Values.cluster.existingSecret | default (printf "%s-cluster" (include "codemode.fullname" .)) -}}
{{- end -}}

{{- define "codemode.image" -}}
{{- printf "%s:%s" .image.repository (.image.tag | default .root.Chart.AppVersion) -}}
{{- end -}}

{{/* The environment every service shares: the cluster secret, and the
     cluster's CA when internal links use TLS. */}}
{{- define "codemode.clusterEnv" -}}
- name: CODEMODE_CLUSTER_SECRET
  valueFrom:
    secretKeyRef:
      name: {{ include "codemode.clusterSecretName" . }}
      key: secret
{{- if .Values.cluster.tls.enabled }}
- name: CODEMODE_CLUSTER_CA
  value: /etc/codemode/cluster-ca/ca.crt
{{- end }}
{{- if .Values.cluster.insecureInternal }}
- name: CODEMODE_INSECURE_INTERNAL
  value: "true"
{{- end }}
{{- end -}}

{{- define "codemode.securityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "codemode.controlplaneURL" -}}
{{- printf "%s://%s-controlplane:%v" (ternary "https" "http" .Values.cluster.tls.enabled) (include "codemode.fullname" .) .Values.controlplane.port -}}
{{- end -}}
