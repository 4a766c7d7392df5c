{{/*
Names. Kubernetes names are at most 63 characters; CronJob names at most 52, because the Jobs
it creates append an 11-character suffix.
*/}}
{{- define "core-jobs.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "core-jobs.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* The CronJob of one job: (dict "ctx" $ "job" "purge"). */}}
{{- define "core-jobs.cronJobName" -}}
{{- printf "%s-%s" (include "core-jobs.fullname" .ctx | trunc 44 | trimSuffix "-") .job }}
{{- end }}

{{- define "core-jobs.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "core-jobs.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "core-jobs.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "core-jobs.imageTag" -}}
{{- .Values.image.tag | default .Chart.AppVersion }}
{{- end }}

{{- define "core-jobs.image" -}}
{{- if .Values.image.digest }}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository (include "core-jobs.imageTag" .) }}
{{- end }}
{{- end }}

{{/*
Labels: (dict "ctx" $ "component" "purge"). The selector labels never change over a release's
life, so they leave out the version.
*/}}
{{- define "core-jobs.selectorLabels" -}}
app.kubernetes.io/name: {{ include "core-jobs.name" .ctx }}
app.kubernetes.io/instance: {{ .ctx.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end }}

{{- define "core-jobs.labels" -}}
helm.sh/chart: {{ include "core-jobs.chart" .ctx }}
{{ include "core-jobs.selectorLabels" . }}
app.kubernetes.io/version: {{ include "core-jobs.imageTag" .ctx | trunc 63 | trimSuffix "-" | trimSuffix "." | quote }}
app.kubernetes.io/managed-by: {{ .ctx.Release.Service }}
app.kubernetes.io/part-of: {{ .ctx.Values.partOf | default .ctx.Chart.Name }}
{{- end }}

{{/*
Every setting the ConfigMap carries: the values' `settings` plus the schedules (so the scheduler
reads the same schedules the CronJobs use), the required `environment` (the alert identity is
bound to it), the stale-dead-letter age (alerting.deadLetterStaleAfterSeconds, which the
PrometheusRule uses too) and, in mode scheduler, the HTTP port. The schema
keeps secret names out of `settings`.
*/}}
{{- define "core-jobs.settings" -}}
{{- $secretNames := list "CORE_JOBS_DATABASE_URL" "CORE_JOBS_BETTERSTACK_API_TOKEN" "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL" "CORE_JOBS_QUEUE_URL" }}
{{- range $name, $value := .Values.settings }}
{{- /* The schema says the same; this still holds under --skip-schema-validation. */}}
{{- if or (has $name $secretNames) (regexMatch "(?i)(TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL)" $name) (regexMatch "://[^/@\\s]*@" (toString $value)) }}
{{- fail (printf "settings.%s looks secret: secrets come only from secrets.existingSecret (secretKeyRef), never from values or the ConfigMap" $name) }}
{{- end }}
{{- end }}
{{- $settings := deepCopy .Values.settings }}
{{- range $job, $cfg := .Values.jobs }}
{{- $_ := set $settings (printf "CORE_JOBS_SCHEDULE_%s" (upper $job)) $cfg.schedule }}
{{- end }}
{{- /* One threshold for both alerting paths: the alerts job's and the PrometheusRule's (alerting.*). */}}
{{- $_ := set $settings "CORE_JOBS_DEAD_LETTER_STALE_AFTER" (toString (int .Values.alerting.deadLetterStaleAfterSeconds)) }}
{{- if eq .Values.mode "scheduler" }}
{{- $_ := set $settings "CORE_JOBS_HTTP_PORT" (toString .Values.scheduler.port) }}
{{- end }}
{{- $_ := set $settings "CORE_JOBS_ALERTS_ENVIRONMENT" (required "environment is required: name this deployment (production, staging-eu…), e.g. --set environment=production; the alert identity is bound to it, so a physical copy of another deployment's database refuses to alert (docs/alerts.md)" .Values.environment) }}
{{- toYaml $settings }}
{{- end }}

{{/*
The env entries every container gets: the secrets by secretKeyRef, then extraEnv. The
`required` makes a release without the Secret fail to render with a message saying why.
*/}}
{{- define "core-jobs.secretEnv" -}}
{{- $secret := required "secrets.existingSecret is required: create a Secret holding the database URL (and the Better Stack token) and pass its name, e.g. --set secrets.existingSecret=core-jobs" .Values.secrets.existingSecret }}
{{- $keys := dict
  "CORE_JOBS_DATABASE_URL" .Values.secrets.databaseUrlKey
  "CORE_JOBS_BETTERSTACK_API_TOKEN" .Values.secrets.betterstackApiTokenKey
  "CORE_JOBS_BETTERSTACK_HEARTBEAT_URL" .Values.secrets.betterstackHeartbeatUrlKey }}
{{- range $name := keys $keys | sortAlpha }}
{{- with get $keys $name }}
- name: {{ $name }}
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ . }}
{{- end }}
{{- end }}
{{- range .Values.extraEnv }}
- name: {{ .name }}
  value: {{ .value | quote }}
{{- end }}
{{- end }}

{{/*
The pod spec shared by the CronJobs, the Deployments and the migration Job:
(dict "ctx" $ "args" (list …) "inlineSettings" bool "container" "<extra container YAML>" "pod" "<extra pod YAML>"
 "secretEnv" "<env YAML instead of core-jobs.secretEnv>" "resources" <instead of .Values.resources>).
inlineSettings puts the settings straight into env instead of reading the ConfigMap: the
migration hook runs before the release's ConfigMap exists.
*/}}
{{- define "core-jobs.podSpec" -}}
{{- $ctx := .ctx }}
{{- $values := $ctx.Values }}
{{- $serviceAccount := include "core-jobs.serviceAccountName" $ctx }}
{{- if and .inlineSettings $values.serviceAccount.create }}
{{- /* The migration hook runs before the release's ServiceAccount exists; it needs no API. */}}
{{- $serviceAccount = "default" }}
{{- end -}}
serviceAccountName: {{ $serviceAccount }}
automountServiceAccountToken: false
{{- with $values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
securityContext:
  {{- toYaml $values.podSecurityContext | nindent 2 }}
{{- with .pod }}
{{ . }}
{{- end }}
containers:
  - name: core-jobs
    image: {{ include "core-jobs.image" $ctx | quote }}
    imagePullPolicy: {{ $values.image.pullPolicy }}
    args:
      {{- toYaml .args | nindent 6 }}
    {{- if not .inlineSettings }}
    envFrom:
      - configMapRef:
          name: {{ include "core-jobs.fullname" $ctx }}
    {{- end }}
    env:
      {{- if .inlineSettings }}
      {{- range $name, $value := include "core-jobs.settings" $ctx | fromYaml }}
      - name: {{ $name }}
        value: {{ $value | quote }}
      {{- end }}
      {{- end }}
      {{- if .secretEnv }}
      {{- .secretEnv | trim | nindent 6 }}
      {{- else }}
      {{- include "core-jobs.secretEnv" $ctx | trim | nindent 6 }}
      {{- end }}
    {{- with .container }}
    {{- . | nindent 4 }}
    {{- end }}
    securityContext:
      {{- toYaml $values.securityContext | nindent 6 }}
    resources:
      {{- toYaml (.resources | default $values.resources) | nindent 6 }}
    volumeMounts:
      - name: tmp
        mountPath: /tmp
volumes:
  - name: tmp
    emptyDir:
      sizeLimit: {{ $values.tmpSizeLimit }}
{{- with $values.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.affinity }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $values.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
Pod template metadata: (dict "ctx" $ "component" "purge" "annotations" (dict …)).
*/}}
{{- define "core-jobs.podMetadata" -}}
labels:
  {{- include "core-jobs.labels" . | nindent 2 }}
{{- $annotations := merge (dict) (.annotations | default dict) .ctx.Values.podAnnotations }}
{{- with $annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/*
A Job that runs to completion and fails at once on exit code 2 (configuration or usage error:
retrying cannot help), while an evicted or preempted pod does not count as a failure.
Written to validate on every minor from kubeVersion's floor (1.27) up: before 1.29 the schema
requires onPodConditions in every rule, so the exit-code rule carries an empty list (the API
server treats [] as absent); before 1.35 it requires a pattern's status (what the server would
default to, "True").
*/}}
{{- define "core-jobs.podFailurePolicy" -}}
podFailurePolicy:
  rules:
    - action: FailJob
      onExitCodes:
        containerName: core-jobs
        operator: In
        values: [2]
      onPodConditions: []
    - action: Ignore
      onPodConditions:
        - type: DisruptionTarget
          status: "True"
{{- end }}

{{/*
The operations API's env: its own database URL (a login granted core_jobs_api, from its own key
of the existing Secret — not the jobs' login, and not the Better Stack secrets), the port, and
the token issuer, then extraEnv.
*/}}
{{- define "core-jobs.apiEnv" -}}
{{- $api := .Values.api }}
{{- $secret := required "secrets.existingSecret is required: create a Secret holding the database URLs and pass its name, e.g. --set secrets.existingSecret=core-jobs" .Values.secrets.existingSecret }}
- name: CORE_JOBS_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $secret }}
      key: {{ required "api.databaseUrlKey is required: the Secret key of the API's database URL (a login granted core_jobs_api)" $api.databaseUrlKey }}
- name: CORE_JOBS_API_PORT
  value: {{ $api.port | toString | quote }}
- name: CORE_JOBS_API_JWKS_URL
  value: {{ required "api.jwksUrl is required with api.enabled: the JWKS URL of your token issuer" $api.jwksUrl | quote }}
- name: CORE_JOBS_API_JWT_ISSUER
  value: {{ required "api.issuer is required with api.enabled: the iss every token must carry" $api.issuer | quote }}
- name: CORE_JOBS_API_JWT_AUDIENCE
  value: {{ required "api.audience is required with api.enabled: the aud every token must carry" $api.audience | quote }}
{{- range .Values.extraEnv }}
- name: {{ .name }}
  value: {{ .value | quote }}
{{- end }}
{{- end }}
