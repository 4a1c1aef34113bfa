"""`locals launch editor`: the values to type into VS Code extensions, Continue, Zed, JetBrains.

Nothing is exec'd or written; the command prints Base URL, API key, model and context
window for the provider called "OpenAI Compatible" in those editors.
"""

from __future__ import annotations

from integrations.base import Detection, Tool, register


@register
class Editor(Tool):
    name = "editor"
    title = "Editors (Kilo Code, Cline, Roo Code in VS Code; Continue; Zed; JetBrains)"
    executable = None
    launches = False
    context_wanted = 32768

    def detect(self) -> Detection:
        return Detection(True, None, None, None)
