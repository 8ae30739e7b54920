
train	/bin/truex28HÿÿÿÿÿÿÿÿÿHRdpRtpX`<